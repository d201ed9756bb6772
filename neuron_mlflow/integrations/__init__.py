"""Front ends over the engine: the decorator / context manager and the Lightning callback."""
