"""Multi-host trials in network namespaces (see runner.py)."""
