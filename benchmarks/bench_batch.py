"""The batch lane against the online lane, at the local fake providers:

- the ledger's cost per item: a 1,000-item batch (claim, checkpoint, hold, submit, collect each
  item through the fenced commit; the fake batch API's three calls included) against 1,000
  online runs whose model answers in the process, as a ratio (target: at most twice);
- money for 1,000 partitions online against batch, at the fake's usage and the prices set here
  (gpt-4o-mini's published per-million prices: 0.15/0.60 online, 0.075/0.30 batch);
- the window of the create call (how long a create is in flight: where a crash leaves a batch
  the lane must find at the provider), for both providers.

    make bench            # runs this after bench_estimate.py
    .venv/bin/python benchmarks/bench_batch.py [--items 1000]
"""

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_ledger import bench_database, header, row, tally

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testkit

from idempotent_jobs import (  # noqa: E402
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    RunLedger,
    run_idempotent,
)
from idempotent_jobs.batches import BatchSteps, advance, open_intent  # noqa: E402
from idempotent_jobs.core.admin import LedgerAdmin  # noqa: E402
from idempotent_jobs.models import OutputSchema, Prompt  # noqa: E402
from idempotent_jobs.models.batches import AnthropicBatches, OpenAIBatches  # noqa: E402
from testkit.fake_providers import Answer, FakeProviders  # noqa: E402

SCHEMA = OutputSchema.of(
    {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
    name="Label",
)


def _prompt(raw: dict[str, Any], identity: RunIdentity) -> Prompt:
    return Prompt.of(system="Label the ticket.", user=str(raw["ticket"]))


def _ids(job: str, n: int) -> list[RunIdentity]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        RunIdentity(job, f"s{i % 10}", start + timedelta(hours=i // 10), "v1") for i in range(n)
    ]


def _collect(identity: RunIdentity) -> dict[str, Any]:
    return {"ticket": f"ticket {identity.subject_id} {identity.scheduled_at:%Y-%m-%d %H}"}


def lanes(url: str, items: int) -> None:
    with FakeProviders(default=lambda r: Answer('{"label": "billing"}', 412, 6)) as fake:
        with LedgerAdmin(url) as admin:
            admin.set_price("gpt-4o-mini", "0.15", "0.60")
            admin.set_price("gpt-4o-mini", "0.075", "0.30", tier="batch")
        with RunLedger(url) as ledger:
            # Online: the same model step's answer, made in the process (no HTTP), so the
            # figure is the ledger's own cost per run; its money is the fake's usage.
            def local(raw: dict[str, Any]) -> ModelAnswer:
                return ModelAnswer({"label": "billing"}, ModelUsage("gpt-4o-mini", 412, 6))

            started = time.perf_counter()
            for identity in _ids("online", items):
                run_idempotent(ledger, identity, collect=_collect, transform=local)
            online = time.perf_counter() - started

            provider = OpenAIBatches(model="gpt-4o-mini", api_key="k", base_url=fake.openai_url)
            steps = BatchSteps(job_name="batched", collect=_collect, prompt=_prompt, schema=SCHEMA)
            provider._client()  # the SDK imported before timing: a process's one-time cost
            started = time.perf_counter()
            batch = open_intent(ledger, steps, provider, _ids("batched", items), worker_id="bench")
            assert batch is not None
            while not advance(ledger, steps, provider, batch.batch_id, worker_id="bench").collected:
                pass
            batched = time.perf_counter() - started
        with LedgerAdmin(url) as admin:
            spend = {s.job_name: s.cost for s in admin.spend_by_job(day=None)}
            currency = admin.currency() or ""
    row(
        f"ledger per item, {items:,} items (batch / online run)",
        f"{batched / items * 1e3:.2f} ms = x{batched / online:.2f}",
        f"online {online / items * 1e3:.2f} ms per run",
        "ok" if batched <= 2 * online else "MISSED",
    )
    batch_money, online_money = spend["batched"], spend["online"]
    assert batch_money is not None and online_money is not None
    row(
        f"money for {items:,} partitions (412 in, 6 out each)",
        f"batch {batch_money:.4f} {currency}",
        f"online {online_money:.4f}: x{float(batch_money) / float(online_money):.2f}",
        "ok" if batch_money < online_money else "MISSED",
    )


def create_window(items: int) -> None:
    """How long one create call is in flight for ``items`` requests, per provider: a crash
    inside it leaves a batch the lane must find at the provider."""
    with FakeProviders() as fake:
        prompt = Prompt.of(system="Label the ticket.", user="ticket")
        for provider in (
            OpenAIBatches(model="gpt-4o-mini", api_key="k", base_url=fake.openai_url),
            AnthropicBatches(model="claude-x", api_key="k", base_url=fake.anthropic_url),
        ):
            lines = [provider.batch_line(f"ij-{n}", prompt, SCHEMA) for n in range(items)]
            times = []
            for _ in range(5):
                started = time.perf_counter()
                provider.create_batch(lines, "intent")
                times.append(time.perf_counter() - started)
            row(
                f"create call in flight, {provider.name}, {items:,} requests (median of 5)",
                f"{sorted(times)[2] * 1e3:.1f} ms",
                "the window a crash may leave a batch unrecorded",
                "-",
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1000)
    args = parser.parse_args(argv)
    header()
    with bench_database() as url:
        lanes(url, args.items)
    create_window(args.items)
    tally()
    return 0


if __name__ == "__main__":
    sys.exit(main())
