"""What an operator runs: the CLI, health findings, the demo, ``dev`` and embedded PostgreSQL."""
