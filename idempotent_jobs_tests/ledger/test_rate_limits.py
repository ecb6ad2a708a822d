"""Provider rate limits decided in the ledger: workers racing for one limit on real threads,
each request admitted by a provider-side token bucket of the same limit (no 429), paced at the
limit's rate, and a subject that arrives behind another's backfill served within a window."""

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotent_jobs import CallBook, CallOrigin, InvalidInputError, RateLimit, RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.rate_limits import (
    BURST_SHARE,
    PACE_SHARE,
    RateRequest,
)
from idempotent_jobs.operator.cli import main
from idempotent_jobs_tests.helpers import claimed
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Limit

WINDOW = 1
RATE = 10  # requests per window
REQUEST = RateRequest("openai", "gpt-4o", tokens=0)


def place(ledger: HarnessLedger, subject: str, n: int, request: RateRequest = REQUEST) -> float:
    """One request's wait for its place (a fresh claim of run ``n`` of ``subject``: a first
    request)."""
    window = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n)
    run = RunIdentity("rate-limited", subject, window, "v1")
    lease = claimed(ledger, run, worker=f"w-{subject}-{n}")
    book = CallBook(ledger, lease, CallOrigin())
    started = time.monotonic()
    book.before_request(request)
    return time.monotonic() - started


@pytest.fixture
def limited(ledger: HarnessLedger, operator: LedgerAdmin) -> HarnessLedger:
    operator.set_rate_limit(
        RateLimit("openai", "gpt-4o", requests_per_minute=RATE, window_seconds=WINDOW)
    )
    return ledger


def test_racing_workers_keep_the_limit_at_its_rate(limited: HarnessLedger) -> None:
    provider = Limit(requests=RATE, window=WINDOW)  # the provider's own bucket
    lock = threading.Lock()
    threads, per_thread = 4, 6
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                place(limited, f"t{n}", i)
                with lock:
                    assert provider.admit("gpt-4o", 0) is None, "the provider would answer 429"
        except BaseException as exc:  # reported below
            errors.append(exc)

    started = time.monotonic()
    running = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(60)
    elapsed = time.monotonic() - started
    assert not errors, errors
    total = threads * per_thread
    burst = int(RATE * BURST_SHARE * PACE_SHARE)  # what the ledger lets go at once
    paced = (total - burst) * WINDOW / (RATE * PACE_SHARE)
    assert paced * 0.95 <= elapsed, "requests went faster than the pace"
    assert elapsed <= (total - burst) * WINDOW / (RATE * 0.9) + 0.5, "under 90% of the limit"


def test_a_subject_behind_a_backfill_is_served_within_a_window(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """Big requests (three tenths of a window's tokens each): six backfill workers in a queue
    would hold almost two windows of reservations; a subject pending may hold half a window,
    so another subject's request goes within a window."""
    operator.set_rate_limit(
        RateLimit("openai", "gpt-4o-mini", tokens_per_minute=1000, window_seconds=WINDOW)
    )
    big = RateRequest("openai", "gpt-4o-mini", tokens=300)
    backfill_threads, backfill_requests = 6, 4
    started = threading.Event()
    waits: list[float] = []
    errors: list[BaseException] = []

    def backfill(n: int) -> None:
        try:
            for i in range(backfill_requests):
                place(ledger, "backfill", n * backfill_requests + i, big)
                started.set()
        except BaseException as exc:  # reported below
            errors.append(exc)

    running = [threading.Thread(target=backfill, args=(n,)) for n in range(backfill_threads)]
    began = time.monotonic()
    for thread in running:
        thread.start()
    assert started.wait(30)
    for n in range(3):  # the scheduled runs of three other subjects, one after another
        waits.append(place(ledger, f"scheduled-{n}", n, big))
    scheduled_done = time.monotonic() - began
    for thread in running:
        thread.join(60)
    backfill_took = time.monotonic() - began
    assert not errors, errors
    assert backfill_took > scheduled_done + WINDOW  # they did not wait for the backfill to end
    assert backfill_took > 3 * WINDOW  # the backfill alone kept the limit busy for seconds
    assert max(waits) <= WINDOW + 0.4, waits  # without the halved horizon: about 2 windows


def test_a_model_without_a_limit_costs_no_statement(
    ledger: HarnessLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(type(ledger), "acquire_rate", lambda self, *a: asked.append(a))
    assert place(ledger, "free", 9) < 1
    assert asked == []
    assert ledger.known_rate_limits() == {}


def test_a_spec_declares_and_an_operator_setting_stands_over_it(
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = RateLimit("anthropic", "claude-haiku-4-5", tokens_per_minute=40_000)
    ledger.declare_rate_limits([declared], "lead-scoring")
    ledger.declare_rate_limits([declared], "lead-scoring")  # once per process: no statement
    [row] = operator.rate_limits()
    assert (row["tokens_per_window"], row["declared_by"]) == (40_000, "lead-scoring")
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", ledger.settings.conninfo)
    args = ["limits", "set", "anthropic", "claude-haiku-4-5"]
    assert main([*args, "--tokens-per-minute", "20000", "--requests-per-minute", "50"]) == 0
    out = capsys.readouterr().out
    assert "at most 50 requests and 20,000 tokens per 60s" in out
    other = RateLimit("anthropic", "claude-haiku-4-5", tokens_per_minute=90_000)
    assert not ledger.declare_rate_limit(other, "another-job")  # the operator's stands
    assert main(["limits", "list"]) == 0
    assert "operator" in capsys.readouterr().out
    assert main(["limits", "delete", "anthropic", "claude-haiku-4-5"]) == 0
    assert operator.rate_limits() == []
    assert main([*args, "--window-seconds", "0", "--tokens-per-minute", "5"]) == 2
    assert "--window-seconds: must be 1 to 86400" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "requests_per_minute"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"tokens_per_minute": True}, "tokens_per_minute"),
        ({"requests_per_minute": 5, "window_seconds": 0}, "window_seconds"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        RateLimit("openai", "gpt-4o", **fields)
    assert refused.value.field == named
