"""The ``idempotent-jobs`` commands, a module each: its handlers and ``add_parser``."""
