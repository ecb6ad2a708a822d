"""Eight worker processes of two deployments share one provider's rate limit through the ledger,
against a fake provider that enforces the same limit itself (429 above it): almost no request
meets a 429, the limit is used at 90% or more while requests wait for it, and the second
deployment's scheduled runs are not held back by the first one's backfill for more than a
window."""

import json
import multiprocessing
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.rate_limits import BURST_SHARE, PACE_SHARE
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Limit, Request

pytestmark = pytest.mark.slow

WINDOW = 2
REQUESTS = 20  # per window: 10 a second
TOKENS = 24_000  # per window; each request counts about 1,030
MAX_TOKENS = 1000


def time_places(record: Callable[[tuple[float, float]], None]) -> None:
    """In this process, ``record`` each request's place under the limit: when it was asked for
    and when it came (the system's monotonic clock, the one the fake provider stamps arrivals
    with)."""
    from idempotent_jobs.core.calls import CallBook

    granted = CallBook.before_request

    def timed(book: CallBook, rate: Any = None) -> None:
        asked = time.monotonic()
        granted(book, rate)
        record((asked, time.monotonic()))

    CallBook.before_request = timed  # type: ignore[method-assign,assignment]


def worker(conninfo: str, url: str, job: str, runs: list[tuple[str, int]], out: Any) -> None:
    """One worker process of one deployment: its runs, one model call each, keeping the limit
    its deployment's spec declares. It reports how long each call waited for its place, and
    when it asked for each place and when the place came (the system's monotonic clock)."""
    from idempotent_jobs import RateLimit, RunIdentity, RunLedger, current_calls, run_idempotent
    from idempotent_jobs.models import OpenAIChat, Prompt, RetryPolicy, answer

    places: list[tuple[float, float]] = []
    time_places(places.append)

    provider = OpenAIChat(model="gpt-4o", api_key="sk", base_url=url, max_tokens=MAX_TOKENS)
    limit = RateLimit(
        "openai", "gpt-4o", REQUESTS, TOKENS, window_seconds=WINDOW
    )  # as each deployment's spec declares it
    waits: list[float] = []
    with RunLedger(conninfo, pool_max_size=2) as ledger:
        ledger.declare_rate_limits([limit], job)

        def transform(raw: dict[str, Any]) -> Any:
            got = answer(provider, Prompt.of(user=f"summarise {raw}"), None, retry=RetryPolicy())
            waits.append(current_calls().rate_wait_seconds)  # held back by the limit
            return got

        for subject, n in runs:
            window = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n)
            run_idempotent(
                ledger,
                RunIdentity(job, subject, window, "v1"),
                collect=lambda identity: {"n": identity.scheduled_at.hour},
                transform=transform,
            )
    out.put((job, waits, places))


def test_eight_workers_of_two_deployments_share_the_limit_fairly(database: str) -> None:
    LedgerAdmin(database).migrate()
    limit = Limit(requests=REQUESTS, tokens=TOKENS, window=WINDOW)
    with FakeProviders(default=lambda request: Answer("a summary", 30, 10), limit=limit) as fake:
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        backfill = [
            context.Process(
                target=worker,
                args=(
                    database,
                    fake.openai_url,
                    "backfill",
                    [("big", n * 10 + i) for i in range(10)],
                    out,
                ),
            )
            for n in range(6)
        ]
        for process in backfill:
            process.start()
        while len(limit.admitted) < REQUESTS:  # the backfill has taken the burst: it queues
            time.sleep(0.05)
        scheduled = [
            context.Process(
                target=worker,
                args=(
                    database,
                    fake.openai_url,
                    "daily",
                    [(f"region-{n}", h) for h in range(3)],
                    out,
                ),
            )
            for n in range(2)
        ]
        for process in scheduled:
            process.start()
        results = [out.get(timeout=240) for _ in range(8)]
        for process in backfill + scheduled:
            process.join(60)
    requests = len(fake.requests)
    assert requests == 66 + limit.throttled
    assert limit.throttled <= requests * 0.01, f"{limit.throttled} of {requests} met a 429"
    times = [t for t, _, _ in limit.admitted]
    busy = times[-1] - times[0]
    # Used: past the first burst, each place granted while the next request already waited
    # for its own must follow it at the limit's pace. A gap no request waited through measures
    # how fast the workers come back for their next run on a loaded machine (the queue
    # draining at the end, or two cores busy with the rest of the suite), not the limit.
    places = sorted((p for _, _, asked in results for p in asked), key=lambda place: place[1])
    grants = places[int(REQUESTS * BURST_SHARE * PACE_SHARE) :]
    gaps = [b[1] - a[1] for a, b in zip(grants, grants[1:], strict=False) if b[0] < a[1]]
    assert len(places) == requests and len(gaps) >= 20, f"only {len(gaps)} places waited for"
    used = len(gaps) * (WINDOW / REQUESTS) / sum(gaps)
    assert used >= 0.9, f"{len(gaps)} places waited for, {sum(gaps):.2f}s: {used:.0%}"
    daily = [w for job, waits, _ in results if job == "daily" for w in waits]
    most = REQUESTS + busy * REQUESTS / WINDOW  # what the provider's own bucket would take
    print(
        f"rate limit shared by 8 workers: {requests} requests, {limit.throttled} met a 429; "
        f"{len(times) / most:.0%} of what the provider would take in {busy:.1f}s, "
        f"{used:.0%} of the limit while requests waited ({len(gaps)} places); "
        f"the scheduled runs waited {max(daily):.2f}s at most (window {WINDOW}s)"
    )
    assert len(daily) == 6 and max(daily) <= WINDOW + 0.5, daily


FRESH_WINDOW = 4
FRESH_REQUESTS = 2  # per window: one every 2 s, below what 8 processes a step ask on 2 cores
FRESH_RUNS = 2  # per worker: 16 requests in all, each from a process of its own


def one_step(conninfo: str, url: str, subject: str, n: int, placed: Any) -> None:
    """A process started for one model step, as Dagster's multiprocess executor starts one per
    step: everything is imported and made here, so its request is its first. It tells
    ``placed`` when it asked for its place under the limit and when the place was granted."""
    from idempotent_jobs import RunIdentity, RunLedger, run_idempotent
    from idempotent_jobs.models import OpenAIChat, Prompt, RetryPolicy, answer

    time_places(lambda place: placed.put((f"{subject}/{n}", place)))
    provider = OpenAIChat(model="gpt-4o", api_key="sk", base_url=url, max_tokens=100)
    with RunLedger(conninfo, pool_max_size=1) as ledger:
        run_idempotent(
            ledger,
            RunIdentity(
                "fresh", subject, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n), "v1"
            ),
            collect=lambda identity: {"n": identity.scheduled_at.hour},
            transform=lambda raw: answer(
                provider, Prompt.of(user=f"step {subject}/{n}"), None, retry=RetryPolicy(0)
            ),
        )


def test_a_process_per_step_keeps_the_limit_and_uses_it(database: str) -> None:
    """Eight workers, each starting a fresh process per model step: the place under the limit
    is taken once the process's client is made, so requests arrive when their places say:
    no 429 from a provider enforcing the same limit, and the limit used at 85% or more."""
    import threading

    from idempotent_jobs import RateLimit

    LedgerAdmin(database).migrate()
    with HarnessLedger(database) as ledger:
        limit_decl = RateLimit("openai", "gpt-4o", FRESH_REQUESTS, window_seconds=FRESH_WINDOW)
        ledger.declare_rate_limits([limit_decl], "fresh")
    limit = Limit(requests=FRESH_REQUESTS, tokens=10**9, window=FRESH_WINDOW)
    arrived: dict[str, float] = {}

    def arrive(request: Request) -> Answer:
        [step] = re.findall(r"step (w\d+/\d+)", json.dumps(request.body))
        arrived[step] = time.monotonic()
        return Answer("a summary", 30, 10)

    with FakeProviders(default=arrive, limit=limit) as fake:
        # Dagster's multiprocess executor with its forkserver start method: a process per step,
        # this package preloaded, the provider's SDK imported by the step's first request.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["idempotent_jobs"])

        exits: list[int | None] = []
        placed = context.Queue()

        def worker(w: int) -> None:
            for n in range(FRESH_RUNS):
                step = context.Process(
                    target=one_step, args=(database, fake.openai_url, f"w{w}", n, placed)
                )
                step.start()
                step.join(120)
                exits.append(step.exitcode)  # a 429 fails its step (no retry here)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        places = dict(placed.get(timeout=10) for _ in range(len(exits)))
    requests = len(fake.requests)
    # Each request arrived right after its place: the SDK was imported and its client made
    # before the place was taken (a fresh process's first request, seconds late otherwise).
    lags = sorted(arrived[step] - places[step][1] for step in places)
    assert lags[-1] < 0.5, f"a request arrived {lags[-1]:.2f}s after its place"
    assert limit.throttled == 0, f"{limit.throttled} of {requests} requests met a 429"
    assert requests == 8 * FRESH_RUNS and exits == [0] * len(exits), exits
    # Used: each place granted while the next step already waited for its own (past the first
    # burst) must follow it at the limit's pace. A gap no step waited through measures how fast
    # fresh processes start on a loaded machine, not the limit, and is left out.
    grants = sorted(places.values(), key=lambda place: place[1])[FRESH_REQUESTS:]
    gaps = [b[1] - a[1] for a, b in zip(grants, grants[1:], strict=False) if b[0] < a[1]]
    pace = FRESH_WINDOW / FRESH_REQUESTS
    assert len(gaps) >= 3, f"only {len(gaps)} places were waited for: no evidence either way"
    used = len(gaps) * pace / sum(gaps)
    print(
        f"a process per step: {requests} requests, {limit.throttled} met a 429; "
        f"arrived {lags[len(lags) // 2]:.3f}s (median), {lags[-1]:.3f}s (most) after the place; "
        f"{used:.0%} of the limit used while steps waited ({len(gaps)} places)"
    )
    assert used >= 0.85, f"{len(gaps)} places waited for, {sum(gaps):.2f}s: {used:.0%}"
