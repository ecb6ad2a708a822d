"""Shadow runs against local fake batch APIs of both providers: a new version's answers computed
on stored runs' inputs, each paid once as the job's call, compared answer by answer, never
accepted nor delivered until a promotion revises the changed runs (one notification each,
under its revision's key); a create whose answer was lost is found, not made twice; budgets
hold; a drop gives back what was held."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from idempotent_jobs import Budget, JobConfig, RunIdentity, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.errors import InvalidInputError, LeaseLostError, OutputRejectedError
from idempotent_jobs.models import OutputSchema, Prompt, ProviderUnavailableError
from idempotent_jobs.shadows import (
    ShadowRule,
    ShadowSteps,
    advance,
    drop,
    gate_reason,
    judge,
    promote,
    start,
)
from idempotent_jobs_tests.helpers import batch_provider
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Request, Status

JOB = "shadow-job"
SCHEMA = OutputSchema.of(
    {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
    name="Label",
)
SUBJECTS = [f"s{n}" for n in range(8)] + ["bad", "err"]


def _v2_answer(request: Request) -> Answer | Status:
    """v2 keeps the label of even subjects, changes odd ones; `bad` answers off-schema, `err`
    gets a per-item 400."""
    text = json.dumps(request.body)
    if "subject err" in text:
        return Status(400, "invalid request", "invalid_request_error")
    if "subject bad" in text:
        return Answer('{"nolabel": 1}', input_tokens=40, output_tokens=4)
    n = int(text.split("subject s")[1][0])
    label = f"L{n}" if n % 2 == 0 else f"NEW{n}"
    return Answer(json.dumps({"label": label}), input_tokens=40, output_tokens=4)


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=_v2_answer) as server:
        yield server


def _steps(**changes: Any) -> ShadowSteps:
    defaults: dict[str, Any] = {
        "schema": SCHEMA,
        "notifications": lambda identity, output: {"webhook": {"label": output["label"]}},
        "config": JobConfig.of(prompt="Label v2.", model="gpt-4o-mini", validator=""),
        "rule": ShadowRule(min_agreement=0.4, max_invalid=1),
    }
    return ShadowSteps(
        job_name=JOB,
        version="v2",
        prompt=lambda raw, identity: Prompt.of(system="Label v2.", user=f"subject {raw['s']}"),
        **{**defaults, **changes},
    )


def _completed_at_v1(ledger: HarnessLedger) -> list[str]:
    """A completed v1 run per subject (label ``L<n>``), delivered once each."""
    ids = []
    for subject in SUBJECTS:
        identity = RunIdentity(JOB, subject, datetime(2026, 11, 1, tzinfo=UTC), "v1")
        label = f"L{subject[1:]}" if subject.startswith("s") else "old"

        def transform(raw: dict[str, Any], label: str = label) -> dict[str, Any]:
            return {"label": label}

        done = run_idempotent(
            ledger,
            identity,
            collect=lambda i: {"s": i.subject_id},
            transform=transform,
            notifications=lambda output: {"webhook": {"label": output["label"]}},
            worker_id="v1",
        )
        assert done.status == "completed"
        ids.append(identity.run_id)
    return ids


def _until_compared(ledger: HarnessLedger, provider: Any, shadow_id: str, steps: int = 10) -> Any:
    for _ in range(steps):
        found = advance(ledger, _steps(), provider, shadow_id, worker_id="w1")
        if found.compared:
            return found
    raise AssertionError(f"shadow {shadow_id} not compared after {steps} steps")


def _shadow_calls(db: psycopg.Connection, shadow_id: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT r.subject_id, c.outcome, c.tier, c.worker_id FROM idempotent_jobs.model_calls c"
        " JOIN idempotent_jobs.runs r USING (run_id) WHERE c.shadow_id = %s"
        " ORDER BY r.subject_id",
        (shadow_id,),
    ).fetchall()


def _outbox(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT r.subject_id, o.revision, o.payload->>'label' FROM"
        " idempotent_jobs.notification_outbox o JOIN idempotent_jobs.runs r USING (run_id)"
        " ORDER BY r.subject_id, o.revision"
    ).fetchall()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_shadow_is_paid_once_compared_and_promoted_through_revisions(
    api: str,
    fake: FakeProviders,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    fake.batches.polls_to_complete = 1
    provider = batch_provider(api, fake)
    _completed_at_v1(ledger)
    before = _outbox(db)
    shadow_id, count = start(operator, _steps(), provider=provider.name, model=provider.model)
    assert count == len(SUBJECTS)
    found = _until_compared(ledger, provider, shadow_id)
    assert len(fake.batches.created[api]) == 1
    summary = found.summary
    assert summary is not None
    assert (summary["agree"], summary["differ"], summary["invalid"], summary["failed"]) == (
        4,
        4,
        1,
        1,
    )
    assert summary["compared"] == 9 and summary["agreement"] == pytest.approx(4 / 9, rel=1e-4)
    # Each answered item is the job's paid call, once, at the batch tier; the 400 costs nothing.
    calls = _shadow_calls(db, shadow_id)
    assert len(calls) == len(SUBJECTS)
    assert {(o, t, w) for _, o, t, w in calls} == {("shadow", "batch", f"shadow:{shadow_id}")}
    # Nothing of the shadow was accepted or sent: every run keeps its v1 answer.
    assert _outbox(db) == before
    labels = db.execute(
        "SELECT DISTINCT output->>'label' FROM idempotent_jobs.runs WHERE revision = 0"
    ).fetchall()
    assert not any(str(label).startswith("NEW") for (label,) in labels)
    # Promote with revisions: the four changed runs get the shadow's answer, one notification
    # each under revision 1; no model call is made and none added.
    total = db.execute("SELECT count(*) FROM idempotent_jobs.model_calls").fetchone()
    done = promote(
        ledger, operator, _steps(), shadow_id, worker_id="op", revise=True, channels=["webhook"]
    )
    assert (done["revised"], done["stale"], done["unchanged"]) == (4, 0, 6)
    assert db.execute("SELECT count(*) FROM idempotent_jobs.model_calls").fetchone() == total
    assert _outbox(db) == sorted(before + [(f"s{n}", 1, f"NEW{n}") for n in (1, 3, 5, 7)])
    accepted = db.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE shadow_id = %s"
        " AND outcome = 'accepted'",
        (shadow_id,),
    ).fetchone()
    assert accepted == (4,)
    # Promoting again does nothing more.
    with pytest.raises(LeaseLostError):
        promote(ledger, operator, _steps(), shadow_id, worker_id="op", revise=True)
    assert gate_reason(ledger.shadow_gate(JOB, "v2"), ShadowRule(), "v2") is None


def test_a_create_whose_answer_was_lost_is_found_not_made_again(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    _completed_at_v1(ledger)
    shadow_id, _ = start(operator, _steps(), sample=3)
    fake.batches.lose_next_creates = 1
    with pytest.raises(ProviderUnavailableError):
        advance(ledger, _steps(), provider, shadow_id, worker_id="w1")
    found = _until_compared(ledger, provider, shadow_id)
    assert len(fake.batches.created["openai"]) == 1
    assert found.calls == 3 and found.summary is not None and found.summary["runs"] == 3


def test_budgets_hold_and_count_a_shadows_calls(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    operator.set_price(provider.model, Decimal(10), Decimal(10))
    _completed_at_v1(ledger)
    operator.set_budget(Budget(amount=10_000_000, period="month"), job_name=JOB)
    # The shadow's own budget has room for two requests' worst case, not three.
    steps = _steps()
    prompt = steps.prompt(
        {"s": "s0"}, RunIdentity(JOB, "s0", datetime(2026, 11, 1, tzinfo=UTC), "v1")
    )
    most_in, most_out = provider.worst_case(prompt, SCHEMA)
    worst = (Decimal(most_in) + Decimal(most_out or 0)) * 10 / 1_000_000
    shadow_id, _ = start(operator, steps, sample=5, budget=worst * Decimal("2.5"))
    found = _until_compared(ledger, provider, shadow_id)
    assert found.calls == 2
    assert found.money is not None and found.money <= worst * Decimal("2.5")
    unsent = db.execute(
        "SELECT count(*) FROM idempotent_jobs.shadow_items WHERE shadow_id = %s"
        " AND call_id IS NULL AND error LIKE 'not sent%%'",
        (shadow_id,),
    ).fetchone()
    assert unsent == (3,)
    # The job's budget counted the shadow's tokens (v1's answers reported none), and nothing
    # stays held.
    [standing] = operator.budgets(JOB)
    tokens = db.execute(
        "SELECT sum(input_tokens + output_tokens) FROM idempotent_jobs.model_calls"
        " WHERE shadow_id = %s",
        (shadow_id,),
    ).fetchone()
    assert tokens is not None and tokens[0] > 0
    assert standing.spent == tokens[0] and standing.reserved == 0
    # The shadow's own totals (what an admission under its budget reads) are its calls'.
    totals = db.execute(
        "SELECT s.spent_total, s.held_total, (SELECT sum(money) FROM"
        " idempotent_jobs.model_calls WHERE shadow_id = s.shadow_id)"
        " FROM idempotent_jobs.shadows s WHERE s.shadow_id = %s",
        (shadow_id,),
    ).fetchone()
    assert totals is not None and totals[0] == totals[2] and totals[1] == 0


def test_a_shadow_is_not_promoted_below_its_rule_and_a_drop_gives_back_its_holds(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    operator.set_price(provider.model, Decimal(1), Decimal(1))
    _completed_at_v1(ledger)
    operator.set_budget(Budget(amount="100", unit="money", period="month"), job_name=JOB)
    strict = _steps(rule=ShadowRule(min_agreement=0.95))
    shadow_id, _ = start(operator, strict)
    found = _until_compared(ledger, provider, shadow_id)
    with pytest.raises(InvalidInputError, match="does not meet the job's rule"):
        promote(ledger, operator, strict, shadow_id, worker_id="op", revise=True)
    reason = gate_reason(ledger.shadow_gate(JOB, "v2"), strict.rule, "v2")
    assert reason is not None and "agree" in reason
    # A second shadow, submitted and dropped before it ends: its holds are given back.
    fake.batches.polls_to_complete = 100
    second, _ = start(operator, strict, sample=4)
    advance(ledger, strict, provider, second, worker_id="w1")
    [standing] = operator.budgets(JOB)
    assert standing.reserved > 0
    dropped = drop(ledger, provider, second, worker_id="op")
    assert dropped.state == "dropped"
    [standing] = operator.budgets(JOB)
    assert standing.reserved == 0
    assert found.state == "compared"


def test_the_verdicts_of_a_scorer() -> None:
    assert judge(None, {"a": 1, "b": " x"}, {"a": 1, "b": "x "}).verdict == "agree"
    differ = judge(None, {"a": 1, "b": 2}, {"a": 1, "b": 3})
    assert differ.verdict == "differ" and differ.score == 0.5
    assert differ.detail == {"fields": {"b": {"accepted": 2, "new": 3}}}
    assert judge(lambda old, new: 0.9, {}, {}, agree_score=0.8).verdict == "agree"
    assert judge(lambda old, new: False, {}, {}).verdict == "differ"
    assert judge(lambda old, new: {"verdict": "agree", "score": 0.7}, {}, {}).score == 0.7
    with pytest.raises(InvalidInputError, match="compare"):
        judge(lambda old, new: 7, {}, {})
    with pytest.raises(InvalidInputError, match="compare"):
        judge(lambda old, new: [1], {}, {})


def test_the_quarantine_lists_invalid_answers_online_and_in_shadows_and_reruns_them(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    _completed_at_v1(ledger)
    # An online answer the validator refused, then the run completed on its retry.
    late = RunIdentity(JOB, "s1", datetime(2026, 11, 2, tzinfo=UTC), "v1")
    answers = iter([{"label": ""}, {"label": "L1"}])
    for _ in range(2):
        try:
            run_idempotent(
                ledger,
                late,
                collect=lambda i: {"s": "s1"},
                transform=lambda raw: next(answers),
                validate=lambda output: bool(output["label"]),
                worker_id="v1",
            )
        except OutputRejectedError:
            pass  # the first answer: refused, its call recorded `rejected`
    shadow_id, _ = start(operator, _steps())
    _until_compared(ledger, provider, shadow_id)
    listed = operator.quarantine(job_name=JOB)
    assert {(r["source"], r["subject_id"]) for r in listed} == {("online", "s1"), ("shadow", "bad")}
    [bad] = operator.quarantine(shadow_id=shadow_id)
    assert bad["raw_input"] == {"s": "bad"} and "schema" in (bad["error"] or "")
    # Re-run in bulk at a version: a shadow of only the quarantined runs.
    again, count = start(operator, _steps(), quarantined=True)
    assert count == 2
    assert {i["subject_id"] for i in ledger.shadow_items(again)} == {"s1", "bad"}


def test_the_online_lane_admits_each_request_and_records_every_paid_one_once(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    from idempotent_jobs.models import answer
    from idempotent_jobs.models.openai_chat import OpenAIChat

    _completed_at_v1(ledger)
    first_off_schema: set[str] = set()

    def online_answer(request: Request) -> Answer | Status:
        """s1 answers off-schema once (a repair turn follows), err a 400, bad off-schema."""
        text = json.dumps(request.body)
        if "subject s1" in text and "s1" not in first_off_schema:
            first_off_schema.add("s1")
            return Answer('{"nolabel": 1}', input_tokens=40, output_tokens=4)
        return _v2_answer(request)

    with FakeProviders(default=online_answer) as fake:
        chat = OpenAIChat(model="gpt-4o-mini", api_key="k", base_url=fake.openai_url)
        steps = _steps()
        online = ShadowSteps(
            **{
                **steps.__dict__,
                "online": lambda raw, identity: answer(
                    chat, steps.prompt(raw, identity), SCHEMA, repair_turns=1
                ),
            }
        )
        shadow_id, count = start(operator, online, lane="online")
        found = advance(ledger, online, None, shadow_id, worker_id="w1")
        assert found.state == "collected"
        found = advance(ledger, online, None, shadow_id, worker_id="w1")
        sent = len(fake.requests)
    assert found.compared and found.summary is not None
    assert (found.summary["agree"], found.summary["differ"]) == (4, 4)
    assert (found.summary["invalid"], found.summary["failed"]) == (1, 1)
    # Every request that reached the provider is one call of the shadow: s1's repair turn
    # too, and bad's (off-schema, then off-schema again after its repair turn).
    calls = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE retry_number IS NULL), min(tier)"
        " FROM idempotent_jobs.model_calls WHERE shadow_id = %s",
        (shadow_id,),
    ).fetchone()
    assert calls is not None and calls[0] == sent == count + 2 and calls[1] == 2
    assert calls[2] != "batch"


def test_an_answer_with_unbelievable_usage_is_invalid_and_recorded_with_what_can_be(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    from idempotent_jobs import ModelAnswer, ModelUsage

    _completed_at_v1(ledger)
    steps = _steps()
    odd = ShadowSteps(
        **{
            **steps.__dict__,
            "online": lambda raw, identity: ModelAnswer(
                {"label": "L0"}, ModelUsage("gpt-4o-mini", 3 * 10**9, 4)
            ),
        }
    )
    shadow_id, count = start(operator, odd, lane="online", subjects=["s0"])
    assert count == 1
    advance(ledger, odd, None, shadow_id, worker_id="w1")
    found = advance(ledger, odd, None, shadow_id, worker_id="w1")
    assert found.summary is not None and found.summary["invalid"] == 1
    row = db.execute(
        "SELECT c.input_tokens, c.output_tokens, i.error FROM idempotent_jobs.model_calls c"
        " JOIN idempotent_jobs.shadow_items i ON i.call_id = c.call_id WHERE c.shadow_id = %s",
        (shadow_id,),
    ).fetchone()
    assert row is not None and row[:2] == (None, 4) and "not believable" in row[2]


def test_a_quarantined_run_that_failed_gets_its_first_answer_from_a_promoted_shadow(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    _completed_at_v1(ledger)
    failed = RunIdentity(JOB, "s3", datetime(2026, 11, 3, tzinfo=UTC), "v1")
    with pytest.raises(OutputRejectedError):  # v1's answer refused: the run failed
        run_idempotent(
            ledger,
            failed,
            collect=lambda i: {"s": "s3"},
            transform=lambda raw: {"label": ""},
            validate=lambda output: bool(output["label"]),
            notifications=lambda output: {"webhook": {"label": output["label"]}},
            worker_id="v1",
        )
    assert [r["run_id"] for r in operator.quarantine(job_name=JOB)] == [failed.run_id]
    shadow_id, count = start(operator, _steps(), quarantined=True)
    assert count == 1
    found = _until_compared(ledger, provider, shadow_id)
    assert found.summary is not None and found.summary["new"] == 1
    assert found.summary["agreement"] is None and found.summary["compared"] == 1
    done = promote(ledger, operator, _steps(), shadow_id, worker_id="op", revise=True)
    assert done["revised"] == 1
    record = ledger.get(failed.run_id)
    assert record is not None and record.status == "completed" and record.revision == 0
    assert record.output == {"label": "NEW3"}
    queued = db.execute(
        "SELECT revision, payload->>'label' FROM idempotent_jobs.notification_outbox"
        " WHERE run_id = %s",
        (failed.run_id,),
    ).fetchall()
    assert queued == [(0, "NEW3")]


def test_a_promotion_goes_on_past_a_run_whose_commit_fails(
    fake: FakeProviders, ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    _completed_at_v1(ledger)
    shadow_id, _ = start(operator, _steps())
    _until_compared(ledger, provider, shadow_id)

    def payload(identity: RunIdentity, output: dict[str, Any]) -> dict[str, Any]:
        if identity.subject_id == "s3":
            raise KeyError("recipient")  # the job's payload builder fails for this run
        return {"webhook": {"label": output["label"]}}

    done = promote(
        ledger, operator, _steps(notifications=payload), shadow_id, worker_id="op", revise=True
    )
    assert (done["revised"], done["failed"], done["stale"]) == (3, 1, 0)
    held = db.execute(
        "SELECT count(*) FROM idempotent_jobs.runs WHERE lease_owner IS NOT NULL"
    ).fetchone()
    assert held == (0,)
    calls = db.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE shadow_id = %s", (shadow_id,)
    ).fetchone()
    assert calls == (len(SUBJECTS),)  # the failed commit added no call
