"""The chaos runner's ``batch`` kind: a batch lane driver (a real process) killed with SIGKILL at
one step of a batch's life, against a fake batch API (OpenAI's or Anthropic's) that answers 5xx
on some endpoint, loses a create's answer, completes slowly, expires part way or fails items,
takes fewer requests a batch than the trial's runs (the driver splits them, or, not told, is
refused with a 400 and gives the runs back), or poisons one item (a result line that is not
JSON, a 200 body that is not an answer, an answer over the ledger's limit, or a payload builder
that raises for it); in some trials an operator then cancels the batches left open (``batches
cancel``), and the provider may refuse the cancel (a 400); then recovery drivers until every
batch is collected, and the outbox delivered.

Kill points (the driver kills itself, ``kill -9``, exactly there): ``before_intent``,
``while_claiming`` (some runs claimed for the batch, no items yet), ``after_intent``,
``before_create`` (the start marked, the provider not called), ``after_create`` (made at the
provider, its answer lost to the driver), ``after_record``, ``while_polling`` (after a status
read), ``between_items`` (part of the results taken), ``none``.

Invariants: at most one provider batch per intent (the fake counts creations: OpenAI's by
the intent its metadata names, Anthropic's against the intents that were submitted); one
accepted result per run; each notification key delivered once; every item the provider
answered recorded as a paid call under its batch, once; every good item the provider answered
accepted (its run completed); no run left held by a batch.
"""

import json
import os
import signal
import time
from collections import Counter, deque
from collections.abc import Iterator
from datetime import UTC, datetime
from random import Random
from typing import Any

import psycopg

from idempotent_jobs_tests.chaos.parts import Verdict, deliver_runs

BATCH_KILL_POINTS = (
    "before_intent",
    "while_claiming",
    "after_intent",
    "before_create",
    "after_create",
    "after_record",
    "while_polling",
    "between_items",
    "none",
)
BATCH_RUNS = 5
ENDPOINTS = ("upload", "create", "retrieve", "list", "results", "cancel")


def batch_identities(trial: int) -> list[Any]:
    from idempotent_jobs import RunIdentity

    return [
        RunIdentity("chaos-batch", f"t{trial}-{n}", datetime(2026, 8, 7, 9, tzinfo=UTC), "v1")
        for n in range(BATCH_RUNS)
    ]


def _steps(trial: int, boom: str | None = None) -> Any:
    from idempotent_jobs.batches import BatchSteps
    from idempotent_jobs.core.records import JobConfig
    from idempotent_jobs.models import OutputSchema, Prompt

    schema = OutputSchema.of(
        {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
        name="Label",
    )
    return BatchSteps(
        job_name="chaos-batch",
        collect=lambda identity: {"subject": identity.subject_id},
        prompt=lambda raw, identity: Prompt.of(system="Label.", user=f"subject {raw['subject']}"),
        schema=schema,
        notifications=lambda identity, output: _payload(identity, output, boom),
        config=JobConfig.of(prompt="Label.", model="m", validator=""),
    )


def _payload(identity: Any, output: dict[str, Any], boom: str | None) -> dict[str, Any]:
    if identity.subject_id == boom:  # the job's payload builder fails for this one item
        raise KeyError("recipient")
    return {"hook": {"label": output["label"]}}


#: How one item of a trial may be poisoned.
POISONS = ("bad_line", "odd_body", "oversize", "payload_raises")


def _provider(spec: dict[str, Any]) -> Any:
    from idempotent_jobs.models.batches import AnthropicBatches, OpenAIBatches

    most = {"max_batch_requests": spec["split"]} if spec.get("split") else {}
    if spec["api"] == "openai":
        return OpenAIBatches(model="gpt-4o-mini", api_key="k", base_url=spec["openai_url"], **most)
    return AnthropicBatches(model="claude-x", api_key="k", base_url=spec["anthropic_url"], **most)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run_batch_driver(spec: dict[str, Any]) -> None:
    """A batch lane driver: opens the trial's batch (unless recovering), then advances every
    open batch of the job until none is left; killed at ``spec['kill']`` (once)."""
    from idempotent_jobs.batches import advance, open_intent
    from idempotent_jobs.core.errors import LeaseLostError
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.models.errors import ProviderError

    kill = spec.get("kill", "none")
    ledger = RunLedger(spec["database_url"])
    provider = _provider(spec)
    steps = _steps(spec["trial"], spec.get("boom"))
    begins, items = 0, 0

    def at(point: str) -> None:
        if kill == point:
            _die()

    real_begin, real_end_item = ledger.begin, ledger.end_batch_item
    real_start, real_record = ledger.start_submit, ledger.record_submitted
    real_create, real_retrieve = provider.create_batch, provider.retrieve_batch

    def begin(*args: Any, **kwargs: Any) -> Any:
        nonlocal begins
        begins += 1
        if begins == 3:
            at("while_claiming")
        return real_begin(*args, **kwargs)

    def end_item(*args: Any, **kwargs: Any) -> Any:
        nonlocal items
        done = real_end_item(*args, **kwargs)
        items += 1
        if items == 2:
            at("between_items")
        return done

    def start_submit(*args: Any) -> Any:
        started = real_start(*args)
        at("before_create")
        return started

    def create(*args: Any) -> Any:
        made = real_create(*args)
        at("after_create")
        return made

    def record(*args: Any) -> Any:
        recorded = real_record(*args)
        at("after_record")
        return recorded

    def retrieve(*args: Any) -> Any:
        found = real_retrieve(*args)
        at("while_polling")
        return found

    for owner, name, wrapper in (
        (ledger, "begin", begin),
        (ledger, "end_batch_item", end_item),
        (ledger, "start_submit", start_submit),
        (ledger, "record_submitted", record),
        (provider, "create_batch", create),
        (provider, "retrieve_batch", retrieve),
    ):
        setattr(owner, name, wrapper)  # the kill points, on this driver's own objects

    worker = f"driver-{os.getpid()}"
    if spec.get("open"):
        at("before_intent")
        left = deque(batch_identities(spec["trial"]))

        def draw() -> Iterator[Any]:
            while left:
                yield left.popleft()

        while left:  # a batch per provider-sized part, as the lane's Dagster op opens them
            for _ in range(5):
                try:
                    open_intent(
                        ledger,
                        steps,
                        provider,
                        draw(),
                        worker_id=worker,
                        lease_seconds=spec["lease_seconds"],
                    )
                    break
                except ProviderError:
                    time.sleep(0.05)
        at("after_intent")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        open_ = ledger.open_batches(["chaos-batch"])
        if not open_:
            break
        for batch_id in open_:
            try:
                advance(ledger, steps, provider, batch_id, worker_id=worker)
            except (ProviderError, LeaseLostError):
                time.sleep(0.05)  # a 5xx, or a dead driver's lease not yet lapsed
    ledger.close()


class BatchTrials:
    """The ``batch`` kind, for :class:`~idempotent_jobs_tests.chaos.runner.Chaos`."""

    def __init__(self, chaos: Any) -> None:
        from testkit.fake_batches import BadLine, OddBody
        from testkit.fake_providers import Answer, FakeProviders, Request, Status

        self.chaos = chaos
        self.rng = Random(chaos.rng.random())
        self.failing: set[str] = set()
        self.poisoned: dict[str, str] = {}  # a subject and how its item is poisoned

        def answer(request: Request) -> Any:
            text = json.dumps(request.body)
            if any(f'subject {s}"' in text for s in self.failing):
                return Status(400, "invalid request", "invalid_request_error")
            poison = next((k for s, k in self.poisoned.items() if f'subject {s}"' in text), None)
            if poison == "bad_line":
                return BadLine(named=True)
            if poison == "odd_body":
                return OddBody({"weird": True})
            if poison == "oversize":
                return Answer(json.dumps({"label": "x" * (1024 * 1024 + 8)}), 40, 300_000)
            return Answer('{"label": "ok"}', 40, 4)

        self.fake = FakeProviders(default=answer)

    def close(self) -> None:
        self.fake.close()

    def trial(self, trial: int) -> Verdict:
        rng, batches = self.rng, self.fake.batches
        api = rng.choice(("openai", "anthropic"))
        kill = BATCH_KILL_POINTS[trial // 2 % len(BATCH_KILL_POINTS)]
        batches.polls_to_complete = rng.randint(0, 2)
        batches.expire_after_items = rng.choice((None, None, None, 3))
        batches.fail_next = {rng.choice(ENDPOINTS): [rng.choice((500, 502, 503))]}
        batches.lose_next_creates = rng.choice((0, 0, 1))
        # "split": the provider takes 2 requests a batch and the lane knows it (3 batches);
        # "refused": the lane does not, and the provider refuses the create with a 400.
        mode = rng.choice(("one", "one", "one", "split", "refused"))
        batches.max_requests[api] = 2 if mode != "one" else 50_000
        cancel = rng.random() < 0.2  # an operator cancels the trial's batches after the kill
        subjects = [identity.subject_id for identity in batch_identities(trial)]
        self.failing = {rng.choice(subjects)} if rng.random() < 0.5 else set()
        healthy = [s for s in subjects if s not in self.failing]
        poison = rng.choice(POISONS) if rng.random() < 0.6 else None
        self.poisoned = {rng.choice(healthy): poison} if poison else {}
        boom = next(iter(self.poisoned)) if poison == "payload_raises" else None
        if cancel and rng.random() < 0.5:  # the provider refuses the operator's cancel
            batches.fail_next["cancel"] = [400]
        spec = {
            "trial": trial,
            "database_url": self.chaos.worker_url,
            "lease_seconds": self.chaos.lease,
            "api": api,
            "openai_url": self.fake.openai_url,
            "anthropic_url": self.fake.anthropic_url,
            "split": 2 if mode == "split" else None,
            "boom": boom,
        }
        created_before = len(batches.created[api])
        process = self.chaos.ctx.Process(
            target=run_batch_driver, args=({**spec, "open": True, "kill": kill},)
        )
        process.start()
        process.join(timeout=120)
        if kill in ("before_intent", "while_claiming"):
            # The intent never (fully) came to be: a new launch opens one for the range, once
            # the dead driver's claims have lapsed.
            self._wait_for_lapsed_claims(trial)
            self._drive({**spec, "open": True})
        if cancel:
            self._cancel_open()
        self._drive(spec)
        self._deliver(trial)
        label = f"batch:{api}+{kill}" + ("" if mode == "one" else f"+{mode}")
        label += f"+{poison}" if poison else ""
        refused = "cancel" in batches.fail_next and not batches.fail_next["cancel"]
        label += ("+cancel" + ("-refused" if refused else "")) if cancel else ""
        verdict = Verdict(trial, label)
        bad = self.failing | set(self.poisoned)
        verdict.problems += self._check(trial, api, created_before, bad)
        made = len(batches.created[api]) - created_before
        if mode == "refused" and made:
            verdict.problems.append(f"{made} batches made over the provider's limit")
        return verdict

    def _wait_for_lapsed_claims(self, trial: int) -> None:
        run_ids = [identity.run_id for identity in batch_identities(trial)]
        with psycopg.connect(self.chaos.url, autocommit=True) as conn:
            self.chaos.wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM idempotent_jobs.runs WHERE run_id = ANY(%s)"
                        " AND status = 'running' AND lease_expires_at >= now()",
                        (run_ids,),
                    ).fetchone()
                    == (0,)
                ),
                "the dead driver's claims to lapse",
            )

    def _cancel_open(self) -> None:
        """``batches cancel`` on every batch of the job that can still be cancelled: an intent
        (whose create may have reached the provider), a submitted batch, a completed one not
        yet collected (an ended one is refused, as it is to an operator)."""
        from idempotent_jobs.core.admin import LedgerAdmin

        with psycopg.connect(self.chaos.url, autocommit=True) as conn:
            open_ = conn.execute(
                "SELECT batch_id FROM idempotent_jobs.batches"
                " WHERE job_name = 'chaos-batch'"
                " AND state NOT IN ('collected', 'cancelled', 'expired', 'failed')"
            ).fetchall()
        with LedgerAdmin(self.chaos.url) as admin:
            for (batch_id,) in open_:
                admin.cancel_batch(batch_id, "chaos")

    def _drive(self, spec: dict[str, Any]) -> None:
        process = self.chaos.ctx.Process(target=run_batch_driver, args=(spec,))
        process.start()
        process.join(timeout=120)

    def _deliver(self, trial: int) -> None:
        deliver_runs(self.chaos.url, self.chaos.receiver.url, batch_identities(trial))

    def _check(self, trial: int, api: str, created_before: int, bad: set[str]) -> list[str]:
        problems: list[str] = []
        run_ids = [identity.run_id for identity in batch_identities(trial)]
        fake = self.fake.batches
        with psycopg.connect(self.chaos.url, autocommit=True) as conn:
            batches = conn.execute(
                "SELECT DISTINCT b.batch_id, b.state, b.provider_batch_id"
                " FROM idempotent_jobs.batches b JOIN idempotent_jobs.batch_items i"
                " USING (batch_id) WHERE i.run_id = ANY(%s)",
                (run_ids,),
            ).fetchall()
            open_ = [b for b in batches if b[1] != "collected"]
            if open_:
                problems.append(f"batches left open: {open_}")
            made = fake.created[api][created_before:]
            submitted = [b for b in batches if b[2] is not None]
            if api == "openai":
                per_intent = Counter(
                    fake.batches[b].metadata.get("idempotent_jobs_batch") for b in made
                )
                twice = {k: n for k, n in per_intent.items() if n > 1}
                if twice:
                    problems.append(f"an intent was submitted {twice}")
            if len(made) > len(submitted):
                problems.append(f"{len(made)} provider batches for {len(submitted)} intents")
            accepted = conn.execute(
                "SELECT run_id, count(*) FROM idempotent_jobs.model_calls"
                " WHERE run_id = ANY(%s) AND outcome = 'accepted'"
                " GROUP BY run_id HAVING count(*) > 1",
                (run_ids,),
            ).fetchall()
            if accepted:
                problems.append(f"runs accepted more than once: {accepted}")
            held = conn.execute(
                "SELECT run_id, lease_owner FROM idempotent_jobs.runs"
                " WHERE run_id = ANY(%s) AND lease_owner LIKE 'batch:%%'"
                " AND status = 'running'",
                (run_ids,),
            ).fetchall()
            if held:
                problems.append(f"runs left held by a batch: {held}")
            # Every item the provider answered is one recorded call under its batch.
            for provider_id in made:
                for line in fake.batches[provider_id].results:
                    answered = (
                        line.get("result", {}).get("type") == "succeeded"
                        if api == "anthropic"
                        else (line.get("response") or {}).get("status_code") == 200
                    )
                    if not answered:
                        continue
                    calls = conn.execute(
                        "SELECT count(*) FROM idempotent_jobs.model_calls c"
                        " JOIN idempotent_jobs.batch_items i ON i.run_id = c.run_id"
                        " AND i.lease_epoch = c.lease_epoch"
                        " AND c.worker_id = 'batch:' || i.batch_id"
                        " WHERE i.custom_id = %s",
                        (line["custom_id"],),
                    ).fetchone()
                    if calls != (1,):
                        problems.append(f"answered item {line['custom_id']} recorded {calls}")
                    status = conn.execute(
                        "SELECT r.subject_id, r.status FROM idempotent_jobs.batch_items i"
                        " JOIN idempotent_jobs.runs r USING (run_id) WHERE i.custom_id = %s",
                        (line["custom_id"],),
                    ).fetchone()
                    if status is not None and status[0] not in bad and status[1] != "completed":
                        problems.append(f"good item of {status[0]} answered, run {status[1]}")
            outbox = conn.execute(
                "SELECT run_id, count(*) FROM idempotent_jobs.notification_outbox"
                " WHERE run_id = ANY(%s) GROUP BY run_id",
                (run_ids,),
            ).fetchall()
        for run_id, rows in outbox:
            sent = self.chaos.receiver.effects.get(f"{run_id}:hook", 0)
            if rows != 1 or sent != 1:
                problems.append(f"run {run_id[:12]}: {rows} outbox rows, delivered {sent} times")
        return problems
