"""The engine: a profiling session's window life cycle, window assembly, ingest of trace files."""
