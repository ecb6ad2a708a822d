"""What names a process is read once, and made again in a forked child."""

import multiprocessing
import os
import random
import socket

from idempotent_jobs.core.this_process import default_worker_id, fork_generation, process_id

FORK = multiprocessing.get_context("fork")


def _child(out: "multiprocessing.Queue[tuple[int, int, list[str]]]") -> None:
    out.put((process_id(), fork_generation(), [default_worker_id() for _ in range(50)]))


def test_a_worker_id_names_host_and_process_and_a_forked_child_names_its_own() -> None:
    ids = [default_worker_id() for _ in range(50)]
    host, pid, _ = ids[0].rsplit(":", 2)
    assert (host, int(pid), process_id()) == (socket.gethostname(), os.getpid(), os.getpid())
    assert len(set(ids)) == 50  # a random suffix per call
    out: multiprocessing.Queue[tuple[int, int, list[str]]] = FORK.Queue()
    children = [FORK.Process(target=_child, args=(out,)) for _ in range(2)]
    for child in children:
        child.start()
    got = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(60)
    pids = {child.pid for child in children}
    assert {pid for pid, _, _ in got} == pids and os.getpid() not in pids
    assert all(generation == fork_generation() + 1 for _, generation, _ in got)
    first, second = (set(worker_ids) for _, _, worker_ids in got)
    # Each child's ids carry its own pid, and the two children drew different suffixes.
    suffixes = [{i.rsplit(":", 1)[1] for i in worker_ids} for worker_ids in (first, second)]
    assert suffixes[0].isdisjoint(suffixes[1]) and set(ids).isdisjoint(first | second)


def test_a_job_seeding_the_random_module_does_not_repeat_worker_ids() -> None:
    """ML code often calls ``random.seed(42)``; two processes doing so must not draw the same
    worker ids (a worker id equal to another's would pass for its lease's owner)."""
    random.seed(42)
    first = [default_worker_id() for _ in range(20)]
    random.seed(42)
    again = [default_worker_id() for _ in range(20)]
    assert set(first).isdisjoint(again)
