"""Trace files: the streaming reader and the passes that summarise a Chrome/Kineto trace."""
