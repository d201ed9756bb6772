"""Where windows go: the local spool, MLflow (upload, sync, reading profiles back, downloads)."""
