"""Costs you can bill by (issue 42), from the user's side: a call is priced once, by the price
row in force when its request was admitted; what the provider never billed costs nothing; a
call whose outcome is unknown stays in doubt until settled; history is append-only; every report
reads the one figure; no error text keeps a key or the prompt."""

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from psycopg import sql

from idempotent_jobs import (
    Budget,
    BudgetExceededError,
    InvalidInputError,
    JobConfig,
    LedgerAdmin,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    run_idempotent,
)
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import (
    OpenAICompatibleModel,
    RunLedgerResource,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs.models import AnthropicMessages, OpenAIChat, answer
from idempotent_jobs.models.answers import RetryPolicy
from idempotent_jobs.models.errors import ProviderError
from idempotent_jobs.models.prompts import Prompt, require
from idempotent_jobs_tests.ledger.test_operator_cli import cli_env, run  # noqa: F401
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.fake_providers import Answer, Drop, FakeProviders, Slow, Status
from testkit.specs import job_spec

JOB = "billed-job"
KEY = "sk-proj-SENTINELKEY0123456789abcdef"
PROMPT_SENTINEL = "the confidential clause SENTINEL-PROMPT-4711 of the contract"


def _ident(subject: str, job: str = JOB) -> RunIdentity:
    return RunIdentity(job, subject, datetime(2026, 12, 1, 9, tzinfo=UTC), "v1")


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer('{"summary": "ok"}', 1000, 200)) as server:
        yield server


def _provider(fake: FakeProviders, api: str, timeout: float = 60.0) -> Any:
    if api == "openai":
        return OpenAIChat(
            model="m1",
            api_key=KEY,
            base_url=fake.openai_url,
            max_tokens=500,
            timeout_seconds=timeout,
        )
    return AnthropicMessages(
        model="m1", api_key=KEY, base_url=fake.anthropic_url, max_tokens=500,
        timeout_seconds=timeout,
    )  # fmt: skip


def _prompt(raw: dict[str, Any]) -> Prompt:
    [text] = require(raw, "text")
    return Prompt.of(system="Summarise the contract.", user=text)


def _call_provider(
    ledger: HarnessLedger, provider: Any, subject: str, budget: Budget | None = None
) -> None:
    run_idempotent(
        ledger,
        _ident(subject),
        collect=lambda i: {"text": PROMPT_SENTINEL},
        transform=lambda raw: answer(
            provider, _prompt(raw), None, retry=RetryPolicy(max_retries=2, sleep=lambda s: None)
        ),
        budget=budget,
        config=JobConfig.of(prompt="p", model="m1", validator=""),
        validate=lambda output: True,
    )


def _calls(db: psycopg.Connection, job: str = JOB) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT c.outcome, c.billing, c.money, c.requested_model, c.provider_name,"
        " c.input_tokens, c.output_tokens FROM idempotent_jobs.model_calls AS c"
        " JOIN idempotent_jobs.runs USING (run_id) WHERE job_name = %s ORDER BY call_id",
        (job,),
    ).fetchall()


def _counter(db: psycopg.Connection, budget_id: str) -> tuple[Any, Any, Any]:
    row = db.execute(
        "SELECT COALESCE(sum(spent), 0), COALESCE(sum(reserved), 0), COALESCE(sum(in_doubt), 0)"
        " FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (budget_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _holds(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone()
    assert row is not None
    return int(row[0])


MONEY = Budget(amount="1", unit="money", period="month")
MONEY_ID = f"job:money/month:{JOB}"


def test_a_price_changed_mid_call_bills_the_admitted_price_and_never_passes_the_budget(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """The issue's 20x overshoot: a 1 USD budget, a call holding 0.2 USD, and a price set to 100
    while it is in flight. The call is billed at the price it was admitted at, and the next
    call is admitted (or refused) at the new one."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "1", "1")

        def transform(raw: dict[str, Any]) -> ModelAnswer:
            admin.set_price("m1", "100", "100")  # the operator, while the call is in flight
            return ModelAnswer({"summary": "s"}, ModelUsage("m1", 100_000, 50_000))

        run_idempotent(
            ledger,
            _ident("a"),
            collect=lambda i: {"x": 1},
            transform=transform,
            budget=MONEY,
            max_tokens_per_call=200_000,
            config=JobConfig.of(prompt="", model="m1", validator=""),
        )
        [(_, billing, money, *_)] = _calls(db)
        assert (billing, money) == ("billed", Decimal("0.15"))  # 150,000 tokens at 1 per M
        assert _counter(db, MONEY_ID) == (Decimal("0.15"), 0, 0)
        with pytest.raises(BudgetExceededError):  # at 100 per M the worst case is 20 USD
            run_idempotent(
                ledger,
                _ident("b"),
                collect=lambda i: {"x": 1},
                transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m1", 1, 1)),
                budget=MONEY,
                max_tokens_per_call=200_000,
                config=JobConfig.of(prompt="", model="m1", validator=""),
            )
        [standing] = admin.budgets(JOB)
        assert standing.spent == Decimal("0.15") and standing.spent <= standing.amount
        assert admin.spend_totals(datetime(2000, 1, 1, tzinfo=UTC), admin.database_now()
                                  + timedelta(seconds=1))["money"] == Decimal("0.15")  # fmt: skip
    assert _holds(db) == 0


def test_price_history_is_append_only(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        past = admin.database_now() - timedelta(days=3)
        # Before any call is priced, a price from the past is a correction: it prices the
        # calls recorded since with none, and only those.
        run_idempotent(
            ledger,
            _ident("unpriced"),
            collect=lambda i: {"x": 1},
            transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m1", 1000, 0)),
            config=JobConfig.of(prompt="", model="m1", validator=""),
        )
        assert [c[2] for c in _calls(db)] == [None]
        corrected = admin.set_price("m1", "2", "2", effective_from=past, set_by="ops")
        assert corrected.correction and corrected.set_by == "ops"
        assert [c[2] for c in _calls(db)] == [Decimal("0.002")]
        # Now a call was priced since then: another price from the past is refused, and
        # the same model, tier and time twice is refused, with nothing written.
        with pytest.raises(InvalidInputError, match="were priced since"):
            admin.set_price("m1", "9", "9", effective_from=past + timedelta(hours=1))
        later = admin.database_now() + timedelta(days=30)
        admin.set_price("m1", "5", "5", effective_from=later)
        with pytest.raises(InvalidInputError, match="never rewritten"):
            admin.set_price("m1", "9", "9", effective_from=later)
        # A price that priced a call is history: it is not deleted.
        with pytest.raises(InvalidInputError, match="priced calls"):
            admin.delete_prices("m1")
        assert [(p.input_per_million, p.correction) for p in admin.prices()] == [
            (Decimal(2), True),
            (Decimal(5), False),
        ]
        assert [c[2] for c in _calls(db)] == [Decimal("0.002")]
        # A price from now on applies to later calls only. Set by no named user (no $USER, as
        # in a container), it says which database role set it.
        assert admin.set_price("m1", "4", "4").set_by == db.info.user
        run_idempotent(
            ledger,
            _ident("later"),
            collect=lambda i: {"x": 1},
            transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m1", 1000, 0)),
            config=JobConfig.of(prompt="", model="m1", validator=""),
        )
        assert [c[2] for c in _calls(db)] == [Decimal("0.002"), Decimal("0.004")]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("status", [500, 429])
def test_an_error_the_provider_answered_costs_nothing_and_its_retry_is_admitted(
    api: str, status: int, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """A 500 or a 429 reports no usage and is not billed: money 0, the hold given back at
    once, so the retry in the same attempt fits the budget; the row names the model asked for
    and the provider."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "10", "10")
        # Room for one request's worst case (500 out + the prompt's bytes) and no more.
        admin.set_budget(Budget(amount="0.012", unit="money", period="month"), job_name=JOB)
        fake.script = [Status(status, "try later", retry_after="0")]
        _call_provider(ledger, _provider(fake, api), "a")
        rows = _calls(db)
        assert [r[:2] for r in rows] == [("failed", "unbilled"), ("accepted", "billed")]
        assert rows[0][2:] == (Decimal(0), "m1", api, 0, 0)
        accepted_money = rows[1][2]
        assert accepted_money == Decimal("0.012")  # 1,000 in and 200 out at 10 per M
        assert _counter(db, f"job:money/month:{JOB}") == (accepted_money, 0, 0)
        [standing] = admin.budgets(JOB)
        totals = admin.spend_totals(
            datetime(2000, 1, 1, tzinfo=UTC), admin.database_now() + timedelta(seconds=1)
        )
        assert standing.spent == totals["money"] == accepted_money
        assert totals["unbilled_calls"] == 1
    assert _holds(db) == 0


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_final_400_is_recorded_unbilled_and_gives_its_hold_back(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "10", "10")
        admin.set_budget(Budget(amount="1", unit="money", period="month"), job_name=JOB)
    fake.script = [Status(400, "bad request")]
    with pytest.raises(ProviderError):
        _call_provider(ledger, _provider(fake, api), "a")
    assert _calls(db) == [("failed", "unbilled", Decimal(0), "m1", api, 0, 0)]
    assert _counter(db, f"job:money/month:{JOB}") == (0, 0, 0)
    assert _holds(db) == 0


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_timeout_after_send_stays_in_doubt_until_settled(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "10", "10")
        admin.set_budget(Budget(amount="1", unit="money", period="month"), job_name=JOB)
        fake.script = [Slow(2.0, Answer('{"summary": "late"}'))]
        provider = _provider(fake, api, timeout=0.3)
        _call_provider(ledger, provider, "a")  # the retry answers
        [doubt, accepted] = _calls(db)
        assert doubt == ("failed", "in_doubt", None, "m1", api, None, None)
        spent, reserved, in_doubt = _counter(db, f"job:money/month:{JOB}")
        assert spent == accepted[2] and reserved == 0 and in_doubt > 0
        [standing] = admin.budgets(JOB)
        assert standing.in_doubt == in_doubt and standing.spent == spent
        [listed] = admin.calls_in_doubt(JOB)
        held = {k: Decimal(str(v)) for k, v in listed["held"].items()}
        assert held == {f"job:money/month:{JOB}": in_doubt}
        # The provider's usage page says it billed 1,000 in and 100 out: 0.011 at 10 per M.
        settled = admin.settle_call(listed["call_id"], input_tokens=1000, output_tokens=100)
        assert (settled["outcome"], settled["money"]) == ("settled", Decimal("0.011"))
        assert _counter(db, f"job:money/month:{JOB}") == (spent + Decimal("0.011"), 0, 0)
        with pytest.raises(InvalidInputError, match="not in doubt"):
            admin.settle_call(listed["call_id"], input_tokens=0, output_tokens=0)
        assert admin.calls_in_doubt(JOB) == []
    assert _holds(db) == 0


def test_a_connection_cut_mid_answer_is_in_doubt(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    fake.script = [Drop(Answer("{}"))]
    _call_provider(ledger, _provider(fake, "openai"), "a")
    assert [r[:2] for r in _calls(db)] == [("failed", "in_doubt"), ("accepted", "billed")]


def test_a_prompt_that_cannot_be_built_sends_nothing_and_books_nothing(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = _provider(fake, "openai")
    for _ in range(4):  # as an op retry policy would run it
        with pytest.raises(InvalidInputError, match="'text'"):
            run_idempotent(
                ledger,
                _ident("no-text"),
                collect=lambda i: {"body": "no text key"},
                transform=lambda raw: answer(provider, _prompt(raw), None),
                config=JobConfig.of(prompt="p", model="m1", validator=""),
            )
    assert _calls(db) == [] and fake.requests == []


def test_an_echoed_key_or_prompt_never_reaches_the_ledger(
    fake: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A proxy that echoes the key it was sent and the prompt in its error body: no text column
    of the ledger, no command's output and nothing on stderr keeps either."""
    echo = (
        f'{{"error": {{"message": "Incorrect API key provided: {KEY}", "api_key": "{KEY}",'
        f' "request": {json.dumps(PROMPT_SENTINEL)}, "auth": "Bearer {KEY}"}}}}'
    )
    fake.script = [Status(401, echo)]
    with pytest.raises(ProviderError) as raised:
        _call_provider(ledger, _provider(fake, "openai"), "a")
    assert KEY not in str(raised.value) and "SENTINEL-PROMPT" not in str(raised.value)
    columns = db.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'idempotent_jobs' AND data_type IN ('text', 'jsonb')"
    ).fetchall()
    for table, column in columns:
        sentinels = [f"%{KEY[8:24]}%"]
        if (table, column) != ("runs", "raw_input"):  # the input itself, not an error text
            sentinels.append("%SENTINEL-PROMPT%")
        for sentinel in sentinels:
            query = sql.SQL("SELECT count(*) FROM {} WHERE {}::text LIKE %s").format(
                sql.Identifier("idempotent_jobs", table), sql.Identifier(column)
            )
            assert db.execute(query, (sentinel,)).fetchone() == (0,), (table, column, sentinel)
    [(error,)] = db.execute("SELECT error FROM idempotent_jobs.model_calls").fetchall()
    assert "Incorrect API key provided: ****" in error and "[prompt]" in error
    code, out = run(capsys, "runs", "show", _ident("a").run_id, "--json")
    assert code == 0 and KEY[8:24] not in out
    data = json.loads(out)
    assert "SENTINEL-PROMPT" not in json.dumps(data["model_calls"])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            [
                "prices",
                "set",
                "m1",
                "--input",
                "1",
                "--output",
                "1",
                "--from",
                "0001-01-01T00:00:00+14:00",
            ],
            "--from",
        ),  # fmt: skip
        (
            ["prices", "set", "m1", "--input", "1", "--output", "1", "--from", "9999-12-31"],
            "--from",
        ),  # fmt: skip
        (["runs", "spend", "--month", "9999-12"], "--month"),
        (["costs", "settle", "1", "--input-tokens", "5"], "--output-tokens"),
        (["costs", "settle", "1", "--not-billed", "--input-tokens", "5"], "--not-billed"),
        (["costs", "settle", "x", "--not-billed"], "call id"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument_and_writes_nothing(
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    db: psycopg.Connection,
    argv: list[str],
    words: str,
) -> None:
    code, out = run(capsys, *argv)
    assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out
    assert db.execute("SELECT count(*) FROM idempotent_jobs.price_history").fetchone() == (0,)
    code, out = run(capsys, "prices", "list")
    assert code == 0, out


def test_every_report_reads_one_money_to_the_cent(
    fake: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Billed, unbilled and in-doubt calls at two prices: `budgets list`, `runs spend`,
    `runs stats`, `runs show` and the calls themselves say the same money."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "3", "15")
        admin.set_budget(Budget(amount="5", unit="money", period="month"), job_name=JOB)
        fake.script = [Status(500, "overloaded", retry_after="0")]
        _call_provider(ledger, _provider(fake, "openai"), "a")
        admin.set_price("m1", "1.25", "10")
        fake.script = [Slow(2.0, Answer("{}"))]
        _call_provider(ledger, _provider(fake, "anthropic", timeout=0.3), "b")
        _call_provider(ledger, _provider(fake, "openai"), "c")
    stored = [c[2] for c in _calls(db) if c[2] is not None]
    assert len(stored) == 4  # two accepted, one unbilled at 0 (the in-doubt one has none)
    expected = sum(stored, Decimal(0))
    code, out = run(capsys, "budgets", "list", "--json")
    [standing] = json.loads(out)
    code, spend = run(capsys, "runs", "spend", "--json")
    code, stats = run(capsys, "runs", "stats", "--json")
    shown = Decimal(0)
    for subject in ("a", "b", "c"):
        code, out = run(capsys, "runs", "show", _ident(subject).run_id, "--json")
        money = json.loads(out)["money"]
        shown += sum((Decimal(m) for m in money["calls"] if m is not None), Decimal(0))
    spent_by_job = {s["job_name"]: s for s in json.loads(stats)["spend"]}[JOB]
    assert Decimal(standing["spent"]) == expected
    assert Decimal(json.loads(spend)["total"]) == expected
    assert Decimal(spent_by_job["cost"]) == expected
    assert shown == expected
    assert json.loads(spend)["in_doubt_calls"] == 1 and spent_by_job["unknown_calls"] == 1
    assert Decimal(standing["in_doubt"]) > 0


def test_prices_list_shows_what_is_in_force_and_history_every_row(
    ledger: HarnessLedger,
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        now = admin.database_now()
        admin.set_price("m1", "1", "1", effective_from=now - timedelta(days=2), set_by="ops")
        admin.set_price("m1", "2", "2", effective_from=now - timedelta(days=1))
        admin.set_price("m1", "3", "3", effective_from=now + timedelta(days=1))
    code, out = run(capsys, "prices", "list", "--json")
    assert code == 0
    assert [p["input_per_million"] for p in json.loads(out)["prices"]] == ["2", "3"]
    code, out = run(capsys, "prices", "list", "--history", "--json")
    rows = json.loads(out)["prices"]
    assert [(p["input_per_million"], p["correction"]) for p in rows] == [
        ("1", True),
        ("2", True),
        ("3", False),
    ]
    code, out = run(capsys, "prices", "list", "--history")
    assert code == 0 and "(correction)" in out and "ops" in out
    run_idempotent(  # a call of a model no price covers: named on a line of its own
        ledger,
        RunIdentity("unpriced-job", "s", datetime(2026, 8, 7, tzinfo=UTC), "v1"),
        collect=lambda identity: {"x": 1},
        transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m9", 10, 5)),
    )
    code, out = run(capsys, "prices", "list")
    assert "\nno price for 1 call(s) of: m9" in out and "\\n" not in out


def test_a_connection_never_made_is_not_billed_and_holds_nothing(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Nothing listens at the provider's address: no byte of a request left, so a storm of
    such failures drains no budget (each is recorded at 0, its hold given back)."""
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = OpenAIChat(
        model="m1", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1", max_tokens=500
    )
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m1", "10", "10")
        admin.set_budget(Budget(amount="0.012", unit="money", period="month"), job_name=JOB)
    with pytest.raises(ProviderError, match="could not connect"):
        _call_provider(ledger, provider, "a")
    assert _calls(db) == [("failed", "unbilled", Decimal(0), "m1", "openai", 0, 0)] * 3
    assert _counter(db, f"job:money/month:{JOB}") == (0, 0, 0)
    assert _holds(db) == 0


ECHO_SPEC = job_spec("echoed_summary")
ECHO_JOB, _ = build_idempotent_job(ECHO_SPEC)


class SecretInput(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"text": PROMPT_SENTINEL}


def test_an_echoed_key_never_reaches_dagsters_event_log(
    dagster_env: DagsterTestEnv, fake: FakeProviders, ledger: HarnessLedger
) -> None:
    """The same echo through a Dagster run: the step's failure in the event log (its message
    and the error's), as the UI and `dg` show it, carries neither the key nor the prompt."""
    fake.script = [Status(401, f"Incorrect API key provided: {KEY}; prompt: {PROMPT_SENTINEL}")]
    defs = dg.Definitions(
        jobs=[ECHO_JOB],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "collector": SecretInput(),
            "model": OpenAICompatibleModel(model="m1", api_key=KEY, base_url=fake.openai_url),
            "report_file": JsonLinesChannel(path=str(dagster_env.notifications)),
        },
    )
    result = defs.resolve_job_def(ECHO_SPEC.name).execute_in_process(
        partition_key="acme|2026-08-07", raise_on_error=False
    )
    assert not result.success
    events = json.dumps(
        [str(e) for e in result.all_events] + [repr(result.failure_data_for_node("transform"))]
    )
    assert "Incorrect API key provided: ****" in events
    where = events.find(KEY[8:24])
    assert where < 0, events[max(0, where - 400) : where + 100]
    where = events.find("SENTINEL-PROMPT")
    assert where < 0, events[max(0, where - 600) : where + 100]
