"""The chaos runner: real processes, a fault proxy and crashes, and its test."""
