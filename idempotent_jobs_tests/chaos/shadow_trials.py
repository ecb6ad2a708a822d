"""The chaos runner's ``shadow`` kind: a shadow driver (a real process) killed with SIGKILL at one
point of a shadow's life, against a fake batch API (OpenAI's or Anthropic's) that may answer
5xx on an endpoint, lose a create's answer or complete slowly; then recovery drivers until the
shadow is compared and, in most trials, promoted with revisions; then the outbox delivered.

Each trial: 6 runs of job ``chaos-shadow`` completed and delivered at v1 (label ``same``), a
shadow of v2 whose answer differs for some subjects, under a job token budget.

Kill points (the driver kills itself, ``kill -9``, exactly there): ``after_start`` (the shadow
and its items made, nothing sent), ``before_create`` (the start marked, the provider not
called), ``after_create`` (made at the provider, its answer lost to the driver),
``while_collecting`` (part of the answers recorded), ``while_comparing`` (part of the verdicts
recorded), ``after_revise`` (a changed run revised, the shadow's answer not yet accepted),
``after_claim`` (a revised run claimed for the shadow's answer, not yet committed),
``after_accept`` (accepted, not yet marked), ``none``.

Invariants: at most one provider batch per shadow; every answered item recorded as one paid
call of the shadow, and no run asked twice; no shadow answer accepted and nothing delivered
before a promotion; after one, each changed run accepted at revision 1 with the shadow's
answer (its paid call, no new one) and delivered once under its revision's key, unchanged runs
untouched; no budget hold left, the budget's tokens equal to the calls'.
"""

import json
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from random import Random
from typing import Any

import psycopg

from idempotent_jobs_tests.chaos.parts import Verdict, deliver_runs

SHADOW_KILL_POINTS = (
    "after_start",
    "before_create",
    "after_create",
    "while_collecting",
    "while_comparing",
    "after_revise",
    "after_claim",
    "after_accept",
    "none",
)
SHADOW_RUNS = 6
JOB = "chaos-shadow"
ENDPOINTS = ("upload", "create", "retrieve", "list", "results")


def shadow_identities(trial: int) -> list[Any]:
    from idempotent_jobs import RunIdentity

    when = datetime(2026, 9, 1, tzinfo=UTC)
    return [RunIdentity(JOB, f"t{trial}-{n}", when, "v1") for n in range(SHADOW_RUNS)]


def _steps() -> Any:
    from idempotent_jobs.core.records import JobConfig
    from idempotent_jobs.models import OutputSchema, Prompt
    from idempotent_jobs.shadows import ShadowRule, ShadowSteps

    schema = OutputSchema.of(
        {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
        name="Label",
    )
    return ShadowSteps(
        job_name=JOB,
        version="v2",
        prompt=lambda raw, identity: Prompt.of(system="Label v2.", user=f"subject {raw['s']}"),
        schema=schema,
        notifications=lambda identity, output: {"hook": {"label": output["label"]}},
        config=JobConfig.of(prompt="Label v2.", model="m2", validator=""),
        rule=ShadowRule(min_agreement=0.0),
    )


def _provider(spec: dict[str, Any]) -> Any:
    from idempotent_jobs.models.batches import AnthropicBatches, OpenAIBatches

    if spec["api"] == "openai":
        return OpenAIBatches(model="gpt-4o-mini", api_key="k", base_url=spec["openai_url"])
    return AnthropicBatches(model="claude-x", api_key="k", base_url=spec["anthropic_url"])


def run_shadow_driver(spec: dict[str, Any]) -> None:
    """A shadow driver: starts the trial's shadow (unless recovering), advances it until it is
    compared, then promotes it with revisions when the trial says so; killed at
    ``spec['kill']`` (once)."""
    from idempotent_jobs.core.admin import LedgerAdmin
    from idempotent_jobs.core.errors import LeaseLostError
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.models.errors import ProviderError
    from idempotent_jobs.shadows import advance, promote, start

    kill = spec.get("kill", "none")
    ledger, admin = RunLedger(spec["database_url"]), LedgerAdmin(spec["database_url"])
    provider, steps = _provider(spec), _steps()
    counts: Counter[str] = Counter()

    def at(point: str) -> None:
        if kill == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(owner: Any, name: str, point: str, nth: int = 1) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            done = real(*args, **kwargs)
            counts[name] += 1
            if counts[name] == nth:
                at(point)
            return done

        setattr(owner, name, wrapper)  # the kill points, on this driver's own objects

    wrap(ledger, "shadow_start_submit", "before_create")
    wrap(provider, "create_batch", "after_create")
    wrap(ledger, "record_shadow_call", "while_collecting", 2)
    wrap(ledger, "judge_shadow_item", "while_comparing", 2)
    wrap(admin, "revise", "after_revise")
    wrap(ledger, "claim", "after_claim")
    wrap(ledger, "complete", "after_accept")
    lease = spec["lease_seconds"]
    worker = f"driver-{os.getpid()}"
    subjects = [i.subject_id for i in shadow_identities(spec["trial"])]
    shadow_id = spec.get("shadow_id")
    if shadow_id is None:
        shadow_id, _ = start(
            admin, steps, subjects=subjects, provider=provider.name, model=provider.model
        )
        with open(spec["shadow_file"], "w") as out:
            out.write(shadow_id)
        at("after_start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            found = advance(
                ledger, steps, provider, shadow_id, worker_id=worker, lease_seconds=lease
            )
            if found.compared:
                break
        except (ProviderError, LeaseLostError):
            row = admin.shadow(shadow_id)
            if row is not None and row["state"] in ("compared", "promoting", "promoted"):
                break  # compared (or on) already: a promotion takes it from here
            time.sleep(0.05)  # a 5xx, or a dead driver's lease not yet lapsed
    while spec.get("promote") and time.monotonic() < deadline:
        try:
            promote(
                ledger,
                admin,
                steps,
                shadow_id,
                worker_id=worker,
                revise=True,
                channels=["hook"],
                lease_seconds=lease,
            )
            break
        except LeaseLostError:
            row = admin.shadow(shadow_id)
            if row is not None and row["state"] == "promoted":
                break
            time.sleep(0.05)
    ledger.close()
    admin.close()


class ShadowTrials:
    """The ``shadow`` kind, for :class:`~idempotent_jobs_tests.chaos.runner.Chaos`."""

    def __init__(self, chaos: Any) -> None:
        from testkit.fake_providers import Answer, FakeProviders, Request

        self.chaos = chaos
        self.rng = Random(chaos.rng.random())
        self.changed: set[str] = set()

        def answer(request: Request) -> Any:
            text = json.dumps(request.body)
            label = "other" if any(f'subject {s}"' in text for s in self.changed) else "same"
            return Answer(json.dumps({"label": label}), 40, 4)

        self.fake = FakeProviders(default=answer)
        self._budget = False

    def close(self) -> None:
        self.fake.close()

    def _setup(self, trial: int) -> None:
        """The trial's runs completed and delivered at v1, under a job token budget."""
        from idempotent_jobs import Budget
        from idempotent_jobs.core.admin import LedgerAdmin
        from idempotent_jobs.core.ledger import RunLedger
        from idempotent_jobs.core.protocol import ModelAnswer, run_idempotent
        from idempotent_jobs.core.records import ModelUsage

        if not self._budget:
            with LedgerAdmin(self.chaos.url) as admin:
                admin.set_budget(Budget(amount=10**9, period="month"), job_name=JOB)
            self._budget = True
        with RunLedger(self.chaos.url) as ledger:
            for identity in shadow_identities(trial):
                run_idempotent(
                    ledger,
                    identity,
                    collect=lambda i: {"s": i.subject_id},
                    transform=lambda raw: ModelAnswer({"label": "same"}, ModelUsage("m1", 30, 3)),
                    notifications=lambda output: {"hook": {"label": output["label"]}},
                    worker_id="v1",
                )
        self._deliver(trial)

    def trial(self, trial: int) -> Verdict:
        rng, batches = self.rng, self.fake.batches
        api = rng.choice(("openai", "anthropic"))
        kill = SHADOW_KILL_POINTS[trial % len(SHADOW_KILL_POINTS)]
        promoting = kill in ("after_revise", "after_claim", "after_accept") or rng.random() < 0.7
        batches.polls_to_complete = rng.randint(0, 2)
        batches.fail_next = {rng.choice(ENDPOINTS): [rng.choice((500, 502, 503))]}
        batches.lose_next_creates = rng.choice((0, 0, 1))
        subjects = [identity.subject_id for identity in shadow_identities(trial)]
        self.changed = set(rng.sample(subjects, rng.randint(1, 3)))
        self._setup(trial)
        shadow_file = self.chaos.workdir / f"shadow-{trial}"
        spec = {
            "trial": trial,
            "database_url": self.chaos.worker_url,
            "lease_seconds": self.chaos.lease,
            "api": api,
            "openai_url": self.fake.openai_url,
            "anthropic_url": self.fake.anthropic_url,
            "promote": promoting,
            "shadow_file": str(shadow_file),
        }
        created_before = len(batches.created[api])
        self._drive({**spec, "kill": kill})
        if not shadow_file.exists():
            return Verdict(trial, f"shadow:{api}+{kill}", ["the driver made no shadow"])
        shadow_id = shadow_file.read_text()
        self._drive({**spec, "shadow_id": shadow_id})
        self._deliver(trial)
        label = f"shadow:{api}+{kill}" + ("+promoted" if promoting else "")
        verdict = Verdict(trial, label)
        verdict.problems += self._check(trial, api, shadow_id, created_before, promoting)
        return verdict

    def _drive(self, spec: dict[str, Any]) -> None:
        process = self.chaos.ctx.Process(target=run_shadow_driver, args=(spec,))
        process.start()
        process.join(timeout=120)

    def _deliver(self, trial: int) -> None:
        deliver_runs(self.chaos.url, self.chaos.receiver.url, shadow_identities(trial))

    def _check(
        self, trial: int, api: str, shadow_id: str, created_before: int, promoted: bool
    ) -> list[str]:
        problems: list[str] = []
        identities = shadow_identities(trial)
        subject_of = {i.run_id: i.subject_id for i in identities}
        fake = self.fake.batches
        made = fake.created[api][created_before:]
        if len(made) > 1:
            problems.append(f"{len(made)} provider batches for one shadow")
        asked = Counter(str(line["custom_id"]) for b in made for line in fake.batches[b].results)
        twice = {k[:12]: n for k, n in asked.items() if n > 1}
        if twice:
            problems.append(f"runs asked twice: {twice}")
        with psycopg.connect(self.chaos.url, autocommit=True) as conn:
            state = conn.execute(
                "SELECT state FROM idempotent_jobs.shadows WHERE shadow_id = %s", (shadow_id,)
            ).fetchone()
            wanted = "promoted" if promoted else "compared"
            if state != (wanted,):
                problems.append(f"shadow ended {state}, not {wanted}")
            calls: dict[str, int] = dict(
                conn.execute(
                    "SELECT run_id, count(*) FROM idempotent_jobs.model_calls"
                    " WHERE shadow_id = %s GROUP BY run_id",
                    (shadow_id,),
                ).fetchall()
            )
            for run_id in asked:
                if calls.get(run_id) != 1:
                    problems.append(f"answered item {run_id[:12]} recorded {calls.get(run_id)}")
            runs = conn.execute(
                "SELECT run_id, status, revision, output->>'label' FROM idempotent_jobs.runs"
                " WHERE run_id = ANY(%s)",
                ([i.run_id for i in identities],),
            ).fetchall()
            for run_id, status, revision, label in runs:
                changed = subject_of[run_id] in self.changed and promoted
                want = (1, "other") if changed else (0, "same")
                if (status, revision, label) != ("completed", *want):
                    problems.append(
                        f"run {subject_of[run_id]}: {status} revision {revision} {label},"
                        f" wanted revision {want[0]} {want[1]}"
                    )
            accepted = conn.execute(
                "SELECT count(*) FROM idempotent_jobs.model_calls WHERE shadow_id = %s"
                " AND outcome = 'accepted'",
                (shadow_id,),
            ).fetchone()
            wanted_accepted = len(self.changed) if promoted else 0
            if accepted != (wanted_accepted,):
                rows = conn.execute(
                    "SELECT r.subject_id, c.outcome, i.verdict, i.answer->>'label'"
                    " FROM idempotent_jobs.model_calls c JOIN idempotent_jobs.runs r USING"
                    " (run_id) JOIN idempotent_jobs.shadow_items i ON i.run_id = c.run_id"
                    " AND i.shadow_id = c.shadow_id WHERE c.shadow_id = %s",
                    (shadow_id,),
                ).fetchall()
                problems.append(
                    f"{accepted} shadow calls accepted, not {wanted_accepted}: {rows}"
                    f" changed {sorted(self.changed)}"
                )
            outbox = conn.execute(
                "SELECT run_id, revision FROM idempotent_jobs.notification_outbox"
                " WHERE run_id = ANY(%s)",
                ([i.run_id for i in identities],),
            ).fetchall()
            held = conn.execute(
                "SELECT count(*) FROM idempotent_jobs.budget_holds WHERE worker_id = %s",
                (f"shadow:{shadow_id}",),
            ).fetchone()
            if held != (0,):
                problems.append(f"budget holds left: {held}")
        for run_id, revision in outbox:
            key = f"{run_id}:hook" + (f":r{revision}" if revision else "")
            if revision and not (promoted and subject_of[run_id] in self.changed):
                problems.append(f"run {subject_of[run_id]} queued revision {revision}")
            sent = self.chaos.receiver.effects.get(key, 0)
            if sent != 1:
                problems.append(f"{key[:20]}…: delivered {sent} times")
        revised = {r for r, rev in outbox if rev == 1}
        if promoted and len(revised) != len(self.changed):
            problems.append(f"{len(revised)} runs re-delivered, {len(self.changed)} changed")
        return problems
