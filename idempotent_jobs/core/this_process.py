"""What names this process, read once per process instead of once per run.

``os.getpid()`` and ``socket.gethostname()`` are system calls, and ``uuid.uuid4()`` reads the
kernel's random source: a worker id made of the three cost every run three of them. The
host and the process id are kept here and made again in a forked child (before any code of
the child runs, by ``os.register_at_fork``), so a child never names itself as its parent.
``fork_generation`` tells process-local state (threads, locks) that it was inherited.
"""

import os
import random
import socket

_host = socket.gethostname()
_pid = os.getpid()
_generation = 0
#: The suffixes' source: seeded from the kernel's, and again in a forked child. Not the
#: ``random`` module's own, which a job may seed (``random.seed(42)`` is common in ML code):
#: two processes so seeded would draw the same suffixes.
_suffixes = random.Random()


def _forked() -> None:
    global _pid, _generation
    _pid = os.getpid()
    _generation += 1
    _suffixes.seed()


os.register_at_fork(after_in_child=_forked)


def process_id() -> int:
    """This process's id (``os.getpid()``, without the system call)."""
    return _pid


def fork_generation() -> int:
    """How many forks separate this process from the one that imported this module: a value
    kept beside process-local state says whether that state was inherited from a parent."""
    return _generation


def default_worker_id() -> str:
    """A worker id unique to this call: host, process and a random 32-bit suffix (from a
    generator of this module's own, seeded by the kernel in each process)."""
    return f"{_host}:{_pid}:{_suffixes.getrandbits(32):08x}"
