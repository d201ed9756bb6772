"""Capture: the profiling backends (``cpu``, ``cuda``, ``neuron``) and reading a live window."""
