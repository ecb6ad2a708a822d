"""Failure drills live in the ledger: scoped to a job, shared by every worker, expiring by
themselves; a drilled failure ends its attempt as ``drill`` and is no model call."""

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.collecting import collect_once
from idempotent_jobs.core.records import CallOrigin, JobConfig
from idempotent_jobs.core.steps import call_model
from idempotent_jobs.dagster.drill import ModelOutageDrill, drill_for
from idempotent_jobs_tests.helpers import claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def test_a_drill_fails_only_its_job_and_only_n_calls(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    operator.arm_drill("lead-scoring", 3, 3600)
    assert ledger.take_drill("ticket-triage") is None
    assert [ledger.take_drill("lead-scoring") for _ in range(4)] == [2, 1, 0, None]
    assert operator.drills() == []


def test_a_drill_for_every_job_and_its_expiry(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    operator.arm_drill("*", 5, 3600)
    assert ledger.take_drill("any-job") == 4
    [armed] = operator.drills()
    assert (armed.job_name, armed.remaining) == ("*", 4)
    db.execute("UPDATE idempotent_jobs.drills SET expires_at = now() - interval '1 s'")
    assert ledger.take_drill("any-job") is None and operator.drills() == []
    operator.arm_drill("*", 2, 3600)  # arming again replaces the expired drill
    assert [d.remaining for d in operator.drills()] == [2]
    assert [d.job_name for d in operator.disarm_drills()] == ["*"]
    with pytest.raises(ValueError, match="calls"):
        operator.arm_drill("*", 0, 3600)


def test_concurrent_workers_take_exactly_n_failures(database: str) -> None:
    workers, tries, armed = 8, 5, 10
    with LedgerAdmin(database) as operator:
        operator.arm_drill("race", armed, 3600)
    start = threading.Barrier(workers)

    def worker() -> int:
        with HarnessLedger(database) as own:
            start.wait()
            return sum(own.take_drill("race") is not None for _ in range(tries))

    with ThreadPoolExecutor(workers) as pool:
        taken = sum(pool.map(lambda _: worker(), range(workers)))
    assert taken == armed


def test_a_drilled_failure_ends_the_attempt_as_drill_and_is_no_call(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    lease = collect_once(ledger, claimed(ledger, ident), lambda: {"documents": ["d"]})
    operator.arm_drill(ident.job_name, 1, 3600)
    called: list[int] = []
    with pytest.raises(ModelOutageDrill, match="failed on purpose"):
        call_model(
            ledger,
            lease,
            lambda raw: called.append(1),
            config=JobConfig(),
            origin=CallOrigin(caller_step="transform"),
            heartbeat_seconds=10,
            before_call=drill_for(ledger, ident.job_name),
        )
    assert called == []
    [attempt] = operator.attempts(ident.run_id)
    assert attempt.outcome == "drill" and attempt.error is not None
    assert ledger.model_calls(ident.run_id) == []
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.lease_owner) == ("failed", None)


def test_run_idempotent_takes_drills_as_the_dagster_steps_do(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """The library driver takes the drill from the shared steps: no model call while it
    lasts, the attempt ends ``drill``, and a run with no drill armed asks no statement more."""
    from idempotent_jobs import ModelAnswer, ModelUsage, run_idempotent

    calls: list[str] = []

    def model(raw: dict[str, object]) -> ModelAnswer:
        calls.append("called")
        return ModelAnswer({"summary": "s"}, ModelUsage("m", 1, 1))

    ident = identity("drilled")
    operator.arm_drill("*", 2, 3600)
    for _ in range(2):
        with pytest.raises(ModelOutageDrill):
            run_idempotent(ledger, ident, collect=lambda i: {"d": 1}, transform=model)
    assert calls == [] and operator.drills() == []
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["drill", "drill"]
    assert ledger.model_calls(ident.run_id) == []
    assert run_idempotent(ledger, ident, collect=lambda i: {"d": 1}, transform=model).executed
    assert calls == ["called"]


def test_a_drill_armed_for_a_name_in_another_unicode_form_is_taken(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    nfd, nfc = "cafe\u0301-digest", "caf\u00e9-digest"
    operator.arm_drill(nfc, 1, 3600)
    assert ledger.take_drill(nfd) == 0
    operator.arm_drill(nfd, 1, 3600)
    assert ledger.take_drill(nfc) == 0


def test_arming_a_drill_for_a_job_the_location_does_not_have_is_refused(
    database: str,
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pathlib import Path

    from idempotent_jobs.core import project_paths as project_module
    from idempotent_jobs.core.database import DATABASE_URL_ENV
    from idempotent_jobs.operator.cli import main
    from idempotent_jobs.operator.location_targets import CODE_LOCATION_ENV

    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.delenv(CODE_LOCATION_ENV, raising=False)
    monkeypatch.setattr(project_module, "CHECKOUT", Path(str(tmp_path)) / "site-packages")
    monkeypatch.chdir(str(tmp_path))
    location = ["-m", "idempotent_jobs.location.definitions"]
    assert main([*location, "drill", "fail-model-calls", "2", "--job", "cl_job"]) == 2
    assert "no job named 'cl_job'" in capsys.readouterr().err
    with LedgerAdmin(database) as operator:
        assert operator.drills() == []
    assert main([*location, "drill", "fail-model-calls", "2", "--job", "cl_job", "--any-job"]) == 0
    capsys.readouterr()
    # Without a code location the name is taken as the identity job name, with a warning.
    assert main(["drill", "fail-model-calls", "1", "--job", "cl-job"]) == 0
    err = capsys.readouterr().err
    assert "warning: no code location to check --job against" in err
