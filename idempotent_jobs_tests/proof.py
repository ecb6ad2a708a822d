"""``make proof``: the whole harnesses, outside pytest, each with its seed and trial count said.

1. chaos trials of every kind (:mod:`idempotent_jobs_tests.chaos`): kills, pauses past the lease,
   dropped commits, restarts, revisions, hostile answers, batches, money;
2. chaos trials with every worker behind PgBouncer in transaction mode;
3. the ``shadow`` kind alone, 100 trials by default (a shadow killed during its start, submit,
   collection, comparison and promotion);
4. the cluster harness (:mod:`idempotent_jobs_tests.cluster`): six hosts in network namespaces,
   one trial of each kind by default; no namespace may be left behind.

Each runs as its own process (as an operator would run it), its summary printed as it ends; the
exit status is 1 when any trial broke the promise or a harness left something behind. Scale with
``--chaos-trials``/``--cluster-trials`` (``make proof CHAOS_TRIALS=200``).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

from idempotent_jobs_tests.chaos.runner import KINDS as CHAOS_KINDS
from idempotent_jobs_tests.cluster.runner import KINDS as CLUSTER_KINDS

ROOT = Path(__file__).resolve().parents[1]
#: The kinds whose faults reach the ledger's connections, run again through PgBouncer.
POOLED_KINDS = ["kill", "stop", "drop", "restart", "revise", "hostile", "answered"]


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def harness(title: str, module: str, *args: str, timeout: float) -> bool:
    """Run one harness to its end (SIGTERM at ``timeout``: it tears its hosts down); whether
    every trial passed."""
    command = [sys.executable, "-m", module, *args]
    print(f"== {title}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        process.wait(timeout=180)
        print(f"== {title}: timed out after {timeout:.0f} s", flush=True)
        return False
    print(
        f"== {title}: exit {process.returncode} in {time.monotonic() - started:.0f} s", flush=True
    )
    return process.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idempotent_jobs_tests.proof")
    parser.add_argument("--chaos-trials", type=int, default=2 * len(CHAOS_KINDS))
    parser.add_argument("--chaos-seed", type=int, default=11)
    parser.add_argument("--pooled-seed", type=int, default=23)
    parser.add_argument("--shadow-trials", type=int, default=100)
    parser.add_argument("--shadow-seed", type=int, default=46)
    parser.add_argument("--cluster-trials", type=int, default=len(CLUSTER_KINDS))
    parser.add_argument("--cluster-seed", type=int, default=1)
    args = parser.parse_args(argv)
    results = {
        "chaos": harness(
            "chaos, every kind",
            "idempotent_jobs_tests.chaos",
            f"--trials={args.chaos_trials}",
            f"--seed={args.chaos_seed}",
            timeout=60 + 20 * args.chaos_trials,
        ),
        "chaos through PgBouncer": harness(
            "chaos through PgBouncer (transaction mode)",
            "idempotent_jobs_tests.chaos",
            f"--trials={len(POOLED_KINDS)}",
            f"--kinds={','.join(POOLED_KINDS)}",
            f"--seed={args.pooled_seed}",
            "--pgbouncer",
            timeout=60 + 20 * len(POOLED_KINDS),
        ),
        "chaos, shadows": harness(
            "chaos, shadow runs",
            "idempotent_jobs_tests.chaos",
            f"--trials={args.shadow_trials}",
            "--kinds=shadow",
            f"--seed={args.shadow_seed}",
            timeout=120 + 20 * args.shadow_trials,
        ),
    }
    before = namespaces()
    results["cluster"] = harness(
        "the cluster harness",
        "idempotent_jobs_tests.cluster",
        f"--trials={args.cluster_trials}",
        f"--seed={args.cluster_seed}",
        timeout=300 + 120 * args.cluster_trials,
    )
    left = namespaces() - before
    if left:
        print(f"== the cluster harness left network namespaces behind: {sorted(left)}")
        results["cluster"] = False
    print("proof: " + ", ".join(f"{k} {'passed' if ok else 'FAILED'}" for k, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
