"""The chaos runner's invariant checker catches what it must. The trials themselves run outside
pytest: ``make proof`` (every kind, and through PgBouncer), thousands on demand with
``python -m idempotent_jobs_tests.chaos --trials 1000``."""

from pathlib import Path

import psycopg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.chaos.parts import Receiver, check_invariants, trial_identity
from idempotent_jobs_tests.helpers import claimed
from idempotent_jobs_tests.ledgers import HarnessLedger


def test_the_invariant_checker_catches_violations(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection, tmp_path: Path
) -> None:
    receiver = Receiver()
    results = tmp_path / "results.jsonl"
    try:
        stuck = trial_identity(1)
        ledger.register(stuck)
        assert ledger.claim(stuck.run_id, "gone", 30) is not None
        lost = check_invariants(db, 1, "planted", receiver, results)
        assert lost.lost == 1 and "run left running without a reason" in lost.problems

        twice = trial_identity(2)
        lease = claimed(ledger, twice, "w", 30)
        ledger.complete(lease, {"summary": "kept"}, {"hook": {"n": 1}})
        receiver.effects[f"{twice.run_id}:hook"] = 2
        results.write_text(
            '{"pid": 1, "event": "outcome", "executed": true, "output": {"summary": "other"}}\n'
        )
        duplicated = check_invariants(db, 2, "planted", receiver, results)
        assert duplicated.duplicates == 2
        assert "revision 0: the accepted output was overwritten" in duplicated.problems

        unanswered = trial_identity(3)
        lease = claimed(ledger, unanswered, "w", 30)
        ledger.complete(lease, {"summary": "s"}, {"hook": {"n": 1}})
        ledger.deliver_outbox(lambda row: None)  # marked delivered, the receiver never said 2xx
        receiver.effects[f"{unanswered.run_id}:hook"] = 1
        marked = check_invariants(db, 3, "planted", receiver, tmp_path / "none.jsonl")
        assert f"{unanswered.run_id}:hook marked delivered without a 2xx answer" in marked.problems

        stale = trial_identity(4)
        first = ledger.checkpoint(claimed(ledger, stale, "w1", 30), {"documents": ["old"]})
        ledger.complete(first, {"summary": "s", "input": "old"}, {"hook": {"n": 1}})
        operator.revise(stale.run_id, "planted", channels=["hook"], recollect=True)
        second = ledger.checkpoint(claimed(ledger, stale, "w2", 30), {"documents": ["new"]})
        ledger.complete(second, {"summary": "s", "input": "old"}, {"hook": {"n": 2}})
        on_old = check_invariants(db, 4, "planted", receiver, tmp_path / "none.jsonl")
        assert "revision 1's output was computed on another checkpoint" in on_old.problems
    finally:
        receiver.close()
