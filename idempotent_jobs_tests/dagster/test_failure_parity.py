"""One matrix of failure cases through the three drivers: the ledger state must be the same.

Each case is a hostile model answer, collector or race. It runs once through ``run_idempotent``,
once through the Dagster job (in process, no op retries) and once through the batch lane (a
provider batch whose item answers as the case's model does), on three subjects of one window,
and the runs' ledger state is compared: status, whether the lease is free, the error, the
attempts' outcomes, the model calls with their tokens, and the outbox.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg
import psycopg
import pytest

from idempotent_jobs import run_idempotent
from idempotent_jobs.batches import BatchSteps, advance, open_intent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.records import JobConfig, ModelUsage
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel, ModelStep, StepContext
from idempotent_jobs.models.answers import Reply
from idempotent_jobs.models.batches import ItemResult, ProviderBatch
from idempotent_jobs.models.errors import ProviderRequestError, ProviderUnavailableError
from idempotent_jobs.models.prompts import Prompt, require
from idempotent_jobs.models.schema import OutputSchema
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.specs import job_spec

Behaviour = Callable[[dict[str, Any], str, str], Any]  # (raw input, run id, conninfo) -> answer


@dataclass(frozen=True)
class Case:
    model: Behaviour
    raw_input: dict[str, Any] | None = None  # what the collector returns (default: small)
    outcome: str = "failed"  # the run's status afterwards
    drilled: bool = False  # a failure drill of the job is armed for both drivers' calls


def _answer(output: dict[str, Any], usage: ModelUsage | None = None) -> Behaviour:
    return lambda raw, run_id, db: ModelAnswer(output, usage or ModelUsage("m", 10, 5))


def _raises(text: str) -> Behaviour:
    def call(raw: dict[str, Any], run_id: str, db: str) -> Any:
        raise RuntimeError(text)

    return call


def _refuse_prompt(raw: dict[str, Any], run_id: str, db: str) -> Any:
    """A prompt builder that needs a key the stored input lacks: nothing is sent."""
    require(raw, "contract_text")
    raise AssertionError("unreachable")


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"summary": "bottom"}
    for _ in range(levels):
        value = {"summary": "s", "next": value}
    return value


def _lose_lease(raw: dict[str, Any], run_id: str, db: str) -> Any:
    """Mid-call, the lease expires and another worker claims the run."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE idempotent_jobs.runs SET lease_expires_at = now() - interval '1 ms'"
            " WHERE run_id = %s",
            (run_id,),
        )
    with HarnessLedger(db) as other:
        assert other.claim(run_id, "other-worker", 600) is not None
    return ModelAnswer({"summary": "late"}, ModelUsage("m", 10, 5))


def _move_basis(raw: dict[str, Any], run_id: str, db: str) -> Any:
    """Mid-call, the run moves to another revision (as a revise racing the call would)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE idempotent_jobs.runs SET revision = revision + 1 WHERE run_id = %s", (run_id,)
        )
    return ModelAnswer({"summary": "computed on the old basis"}, ModelUsage("m", 10, 5))


CASES: dict[str, Case] = {
    "model raises": Case(_raises("provider down")),
    "invalid answer": Case(_answer({"summary": ""})),
    "oversize output": Case(_answer({"summary": "x" * (1024 * 1024 + 1)})),
    "too deep output": Case(_answer(_deep(150))),
    "NaN output": Case(_answer({"summary": "s", "score": float("nan")})),
    "NUL output": Case(_answer({"summary": "a\x00b"})),
    "not a dict": Case(_answer(["a", "list"])),  # type: ignore[arg-type]
    "huge tokens": Case(_answer({"summary": "s"}, ModelUsage("m", 3_000_000_000, 5))),
    "negative tokens": Case(_answer({"summary": "s"}, ModelUsage("m", -1000, -5))),
    "hostile error text": Case(_raises("bad \x00 byte, lone \udc80 surrogate\x1b[31m" * 400)),
    "oversize input": Case(_answer({"summary": "s"}), raw_input={"blob": "y" * (1024 * 1024)}),
    "lost lease": Case(_lose_lease, outcome="running"),
    "stale basis": Case(_move_basis, outcome="pending"),
    "failure drill": Case(_answer({"summary": "never asked"}), drilled=True),
    "prompt refused": Case(_refuse_prompt),
}

CURRENT: dict[str, Case] = {}  # the case the Dagster resources below act out


class CaseCollector(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return CURRENT["case"].raw_input or {"documents": ["a small input"]}


class CaseModel(ModelStep):
    database_url: str

    @property
    def model_name(self) -> str:
        return "case-model"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> Any:
        return CURRENT["case"].model(raw_input, context.run_id, self.database_url)


SPEC = job_spec(
    "parity_job", subjects=["via-dagster", "via-protocol", "via-lane"], wait_seconds=0.0
)
JOB, _ = build_idempotent_job(SPEC)


def _defs(env: DagsterTestEnv) -> dg.Definitions:
    return dg.Definitions(
        jobs=[JOB],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "model": CaseModel(database_url=env.database),
            "collector": CaseCollector(),
            "report_file": JsonLinesChannel(path=str(env.notifications)),
        },
    )


class CaseBatches:
    """A provider batch API whose items answer as the current case's model would answer online:
    the lane's item answer is the case's (its output and usage, or what it raises)."""

    name = "case-provider"
    model = "case-model"
    marks_batches = True
    max_batch_requests = 100
    max_batch_bytes = 10**9

    def __init__(self, case: Case, database: str) -> None:
        self.case, self.database = case, database
        self.runs: dict[int, tuple[str, dict[str, Any]]] = {}  # a prompt's run and raw input
        self.items: dict[str, tuple[str, dict[str, Any]]] = {}  # a custom_id's

    def prompt(self, raw: dict[str, Any], identity: RunIdentity) -> Prompt:
        if self.case.model is _refuse_prompt:  # the lane builds the prompt before the call
            require(raw, "contract_text")
        made = Prompt.of(system="parity", user=identity.run_id)
        self.runs[id(made)] = (identity.run_id, raw)
        return made

    def batch_line(self, custom_id: str, prompt: Prompt, schema: Any) -> dict[str, Any]:
        self.items[custom_id] = self.runs[id(prompt)]
        return {"custom_id": custom_id}

    def worst_case(self, prompt: Prompt, schema: OutputSchema | None) -> tuple[int, int | None]:
        return 0, None

    def create_batch(self, lines: list[dict[str, Any]], intent: str) -> ProviderBatch:
        self.made = [str(line["custom_id"]) for line in lines]
        return ProviderBatch("case-batch-1", "submitted", {})

    def find_batches(self, intent: str, since: Any, requests: int) -> list[ProviderBatch]:
        return []

    def retrieve_batch(self, provider_batch_id: str) -> ProviderBatch:
        return ProviderBatch(provider_batch_id, "completed", {})

    def cancel_batch(self, provider_batch_id: str) -> ProviderBatch:
        return ProviderBatch(provider_batch_id, "cancelled", {})

    def batch_results(self, batch: ProviderBatch) -> Any:
        for custom_id in self.made:
            yield ItemResult(custom_id, reply=Reply(None, ModelUsage(None, None, None)))

    def item_answer(self, result: ItemResult, schema: OutputSchema | None) -> Any:
        run_id, raw = self.items[result.custom_id]
        return self.case.model(raw, run_id, self.database)


def through_the_lane(
    case: Case, identity: RunIdentity, ledger: HarnessLedger, database: str
) -> None:
    """The run of ``identity`` through the batch lane, submitted and collected."""
    provider = CaseBatches(case, database)
    steps = BatchSteps(
        job_name=SPEC.identity_job_name,
        collect=lambda ident: case.raw_input or {"documents": ["a small input"]},
        prompt=provider.prompt,
        validate=SPEC.validate,
        notifications=SPEC.notifications,
        config=JobConfig(),
    )
    batch = open_intent(ledger, steps, provider, [identity], worker_id="lane", lease_seconds=30.0)
    if batch is None:  # its attempt ended before it was an item (its input, drill or prompt)
        return
    for _ in range(3):
        if advance(ledger, steps, provider, batch.batch_id, worker_id="lane").collected:
            return
    raise AssertionError("the lane did not collect its batch")


def ledger_state(db: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """Everything a failure may leave, without ids, workers or times. The checkpoint too:
    ``run_idempotent``'s travels with the model call, and every failure must still store it
    (the retry reuses it) as the drivers that store it before the call do."""
    run = db.execute(
        "SELECT status, lease_owner IS NULL, last_error, revision, raw_input IS NOT NULL,"
        " input_fingerprint FROM idempotent_jobs.runs WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    attempts = db.execute(
        "SELECT lease_epoch, outcome, error, model_name, input_tokens, output_tokens"
        " FROM idempotent_jobs.run_attempts WHERE run_id = %s ORDER BY lease_epoch",
        (run_id,),
    ).fetchall()
    calls = db.execute(
        "SELECT lease_epoch, revision, outcome, model_name, input_tokens, output_tokens, error"
        " FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
        (run_id,),
    ).fetchall()
    outbox = db.execute(
        "SELECT channel, revision FROM idempotent_jobs.notification_outbox WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    assert run is not None
    status, lease_free, error, revision, has_input, fingerprint = run
    return {
        "status": status,
        "lease_free": lease_free,
        "error": error,
        "revision": revision,
        "checkpointed": has_input,
        "checkpoint": fingerprint,
        "attempts": attempts,
        "model_calls": calls,
        "outbox": outbox,
    }


PARTITION = "{subject}|2026-08-07"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_failure_leaves_the_same_ledger_state_through_both_drivers(
    name: str,
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    case = CURRENT["case"] = CASES[name]
    via_dagster = SPEC.identity_for(PARTITION.format(subject="via-dagster"))
    via_protocol = SPEC.identity_for(PARTITION.format(subject="via-protocol"))
    if case.drilled:  # one drilled call for each driver
        operator.arm_drill(SPEC.identity_job_name, 1, 3600)

    job = _defs(dagster_env).resolve_job_def("parity_job")
    result = job.execute_in_process(
        partition_key=PARTITION.format(subject="via-dagster"), raise_on_error=False
    )
    assert not result.success
    if case.drilled:
        operator.arm_drill(SPEC.identity_job_name, 1, 3600)

    with pytest.raises(Exception):  # noqa: B017 - each case fails in its own way
        run_idempotent(
            ledger,
            via_protocol,
            collect=lambda ident: case.raw_input or {"documents": ["a small input"]},
            transform=lambda raw: case.model(raw, via_protocol.run_id, dagster_env.database),
            validate=SPEC.validate,
            notifications=lambda output: SPEC.notifications(via_protocol, output),
            lease_seconds=30.0,
        )

    via_lane = SPEC.identity_for(PARTITION.format(subject="via-lane"))
    if case.drilled:
        operator.arm_drill(SPEC.identity_job_name, 1, 3600)
    through_the_lane(case, via_lane, ledger, dagster_env.database)

    dagster_state = ledger_state(db, via_dagster.run_id)
    protocol_state = ledger_state(db, via_protocol.run_id)
    assert dagster_state == protocol_state
    assert ledger_state(db, via_lane.run_id) == protocol_state
    assert dagster_state["status"] == case.outcome
    if case.outcome == "failed":  # the attempt ended: the next one claims now, not on expiry
        assert dagster_state["lease_free"]
        assert ledger.claim(via_dagster.run_id, "next-worker", 30) is not None
    if dagster_state["error"] is not None:
        error = dagster_state["error"]
        assert "\x00" not in error and len(error) <= 4000
        error.encode("utf-8")  # no lone surrogate survives
    if name == "hostile error text":
        assert dagster_state["error"].startswith("RuntimeError: bad \\x00 byte, lone \\udc80")


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("model raises", [(1, 0, "failed", None, None, None)]),  # a raised call reports no usage
        ("invalid answer", [(1, 0, "rejected", "m", 10, 5)]),
        ("oversize output", [(1, 0, "rejected", "m", 10, 5)]),
        ("huge tokens", [(1, 0, "rejected", "m", None, 5)]),
        ("negative tokens", [(1, 0, "rejected", "m", None, None)]),
        ("oversize input", []),
        ("prompt refused", []),  # sent nothing: no call, not even one of unknown usage
        ("lost lease", [(1, 0, "lease_lost", "m", 10, 5)]),  # paid for: recorded though lost
        ("stale basis", [(1, 0, "stale", "m", 10, 5)]),
    ],
)
def test_every_paid_call_is_recorded_with_the_usage_that_can_be_believed(
    name: str,
    calls: list[tuple[Any, ...]],
    ledger: HarnessLedger,
    db: psycopg.Connection,
    database: str,
) -> None:
    case = CASES[name]
    ident = SPEC.identity_for(PARTITION.format(subject="via-protocol"))
    with pytest.raises(Exception):  # noqa: B017
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: case.raw_input or {"documents": ["a small input"]},
            transform=lambda raw: case.model(raw, ident.run_id, database),
            validate=SPEC.validate,
        )
    got = db.execute(
        "SELECT lease_epoch, revision, outcome, model_name, input_tokens, output_tokens"
        " FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
        (ident.run_id,),
    ).fetchall()
    assert got == calls


def test_relaunches_after_unbelievable_usage_claim_at_once_and_record_every_call(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """Three launches, three provider calls, three recorded (none stuck behind a held lease)."""
    CURRENT["case"] = CASES["huge tokens"]
    job = _defs(dagster_env).resolve_job_def("parity_job")
    key = PARTITION.format(subject="via-dagster")
    for _ in range(3):
        assert not job.execute_in_process(partition_key=key, raise_on_error=False).success
    run_id = SPEC.identity_for(key).run_id
    calls = ledger.model_calls(run_id)
    assert [c.outcome for c in calls] == ["rejected"] * 3
    assert [c.lease_epoch for c in calls] == [1, 2, 3]
    assert all(c.input_tokens is None and c.output_tokens == 5 for c in calls)
    assert [a.outcome for a in operator.attempts(run_id)] == ["failed"] * 3


class FlakyIOManager(dg.ConfigurableIOManager):
    """Dagster's storage between steps, failing as an object store can: ``fail`` names what
    fails (``load`` persist's input, or ``store`` transform's output), on the first Dagster
    run only; later runs store and load in memory."""

    fail: str

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if self.fail == "store" and context.step_key == "transform" and not IO_FAILED:
            IO_FAILED.append(context.run_id)
            raise ConnectionError("object store refused the upload")
        STORED[(context.run_id, context.step_key)] = obj

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        assert upstream is not None
        if self.fail == "load" and upstream.step_key == "transform" and not IO_FAILED:
            IO_FAILED.append(str(upstream.run_id))
            raise ConnectionError("object store timed out")
        return STORED[(upstream.run_id, upstream.step_key)]


STORED: dict[tuple[str, str], Any] = {}
IO_FAILED: list[str] = []
PAID: list[str] = []


def _paid(raw: dict[str, Any], run_id: str, db: str) -> Any:
    PAID.append(run_id)
    return ModelAnswer({"summary": f"answer #{len(PAID)}"}, ModelUsage("m", 100, 50))


@pytest.mark.parametrize("fail", ["load", "store"])
def test_a_paid_answer_survives_storage_between_steps_failing(
    fail: str, dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """The IO manager fails between ``transform`` and ``persist``: the call is in the books
    (tokens, spend) at once, the attempt ends within the Dagster run (not at lease expiry,
    error kept), and the next launch commits the recorded answer without paying again."""
    CURRENT["case"] = Case(_paid)
    for kept in (STORED, IO_FAILED, PAID):
        kept.clear()
    defs = _defs(dagster_env)
    job = dg.Definitions.merge(
        defs, dg.Definitions(resources={"io_manager": FlakyIOManager(fail=fail)})
    ).resolve_job_def("parity_job")
    key = PARTITION.format(subject="via-dagster")
    run_id = SPEC.identity_for(key).run_id

    assert not job.execute_in_process(partition_key=key, raise_on_error=False).success
    state = ledger_state(db, run_id)
    assert state["status"] == "failed" and state["lease_free"]
    assert "ConnectionError: object store" in state["error"]
    step = "persist" if fail == "load" else "transform"
    assert f"step {step} failed" in state["error"]
    assert state["model_calls"] == [(1, 0, "answered", "m", 100, 50, None)]
    spent = db.execute(
        "SELECT sum(tokens) FROM idempotent_jobs.spend_days WHERE job_name = 'parity-job'"
    ).fetchone()
    assert spent == (150,)

    assert job.execute_in_process(partition_key=key).success  # a new launch
    state = ledger_state(db, run_id)
    assert state["status"] == "completed" and len(PAID) == 1
    assert state["model_calls"] == [(1, 0, "accepted", "m", 100, 50, None)]
    assert [a[1] for a in state["attempts"]] == ["failed", "completed"]
    record = ledger.get(run_id)
    assert record is not None and record.output == {"summary": "answer #1"}
    # Once committed, the answer lives on the run alone (under the retention policy).
    assert db.execute(
        "SELECT answer FROM idempotent_jobs.model_calls WHERE run_id = %s", (run_id,)
    ).fetchall() == [(None,)]


# The parity job's spec with an op retry policy that would retry the model step three times.
RETRIED = replace(
    SPEC,
    name="retried_job",
    identity_job_name="retried-job",
    subjects=["refused", "flaky", "final", "overloaded"],
    model_retry=dg.RetryPolicy(max_retries=3),
)
RETRIED_JOB, _ = build_idempotent_job(RETRIED)


class CountingModel(ModelStep):
    """Refuses its prompt before any request for subject ``refused``; raises a provider-like
    error once, then answers, for ``flaky``. Counts what it was asked."""

    database_url: str

    @property
    def model_name(self) -> str:
        return "counting-model"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> Any:
        ASKED.append(context.identity.subject_id)
        if context.identity.subject_id == "refused":
            require(raw_input, "contract_text")
        if context.identity.subject_id == "final":  # the provider's 400: another try pays again
            raise ProviderRequestError("invalid model", provider="fake", status=400)
        if context.identity.subject_id == "overloaded" and ASKED.count("overloaded") == 1:
            raise ProviderUnavailableError("overloaded", provider="fake", status=529)
        if ASKED.count("flaky") == 1:
            raise RuntimeError("provider down")
        return ModelAnswer({"summary": "ok"}, ModelUsage("m", 10, 5))


ASKED: list[str] = []


@pytest.mark.parametrize(
    ("subject", "asked", "succeeds"),
    [("refused", 1, False), ("flaky", 2, True), ("final", 1, False), ("overloaded", 2, True)],
)
def test_a_step_that_sent_nothing_is_not_retried_and_one_that_failed_at_the_provider_is(
    subject: str,
    asked: int,
    succeeds: bool,
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    db: psycopg.Connection,
) -> None:
    """The op's retry policy would read the same stored input again: a refusal before any
    request (a prompt that cannot be built) fails the step at once, with no call booked."""
    ASKED.clear()
    defs = dg.Definitions(
        jobs=[RETRIED_JOB],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "model": CountingModel(database_url=dagster_env.database),
            "collector": CaseCollector(),
            "report_file": JsonLinesChannel(path=str(dagster_env.notifications)),
        },
    )
    CURRENT["case"] = Case(_answer({"summary": "unused"}))
    result = defs.resolve_job_def("retried_job").execute_in_process(
        partition_key=f"{subject}|2026-08-07", raise_on_error=False
    )
    assert result.success is succeeds
    assert ASKED == [subject] * asked
    run_id = RETRIED.identity_for(f"{subject}|2026-08-07").run_id
    calls = db.execute(
        "SELECT outcome FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
        (run_id,),
    ).fetchall()
    expected = {
        "refused": [],  # sent nothing: no call, no retry
        "final": [("failed",)],  # a final 400: one call, not retried
    }.get(subject, [("failed",), ("accepted",)])  # may pass: retried by the op's policy
    assert calls == expected
