"""The money part of the chaos runner's ``budget`` kind: worker processes racing under a money
budget against a provider that answers 429, 500 and 400, times out after the request was sent,
cuts answers off, or answers well, while an operator changes the model's price with requests
in flight (inside the provider's handler, so the request was admitted at the old price).

Invariants:
- spend plus what is in doubt never passes the budget (nor grows, when the day's spend before
  the budget was set had passed it: the calls of the trial's token part count);
- nothing is left held (no budget hold, nothing reserved, no run leased);
- every request the provider received is one recorded call;
- the budget's counter is the money the calls were recorded with (the calls the provider
  answered with an error at 0) and what `runs show` says they cost, to the cent;
- what is in doubt is what the calls in doubt hold;
- once an operator settles each call in doubt as not billed, nothing is in doubt and the spend
  is unchanged.
"""

import json
import threading
from decimal import Decimal
from random import Random
from typing import Any

import psycopg

from idempotent_jobs import Budget
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs_tests.chaos.parts import Verdict, trial_identity
from testkit.fake_providers import Answer, Drop, FakeProviders, Request, Scripted, Slow, Status

MODEL = "chaos-model"
#: Four runs of the trial's subject, at hours the other parts of a trial do not use.
HOURS = (11, 12, 13, 14)
#: Room for about three requests' worst case at the low price, none at the high one.
CAP = Decimal("0.004")
LOW, HIGH = "1", "100"
CLIENT_TIMEOUT = 0.4


class MoneyTrials:
    """A billing provider of its own (its faults on its own random stream) and the checks."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = Random(seed)
        self.lock = threading.Lock()
        self.price_changes = 0
        self.changes_before = 0
        self.provider = FakeProviders(default=self.answer)

    def close(self) -> None:
        self.provider.close()

    def answer(self, request: Request) -> Scripted:
        asked = json.loads(request.body["messages"][1]["content"])
        good = json.dumps({"summary": f"trial {asked['trial']}", "input": asked["documents"][0]})
        with self.lock:
            roll, reprice = self.rng.random(), self.rng.random() < 0.3
        if reprice:  # the operator, while this request is in flight
            self._set_price(HIGH if self.price_changes % 2 == 0 else LOW)
        if roll < 0.15:
            return Status(429, "Rate limit reached", "rate_limit_exceeded", retry_after="0.01")
        if roll < 0.30:
            return Status(500, "The server had an error", "server_error")
        if roll < 0.38:
            return Status(400, "Invalid request", "invalid_request_error")
        if roll < 0.46:
            return Slow(CLIENT_TIMEOUT * 2.5, Answer(good, 120, 30))  # sent, then a timeout
        if roll < 0.54:
            return Drop(Answer(good, 120, 30))  # cut mid-answer
        return Answer(good, 120, 30)

    def _set_price(self, per_million: str) -> None:
        try:
            with LedgerAdmin(self.url) as admin:
                admin.set_price(MODEL, per_million, per_million, set_by="chaos")
            self.price_changes += 1
        except InvalidInputError:  # two changes in one instant: one of them stands
            pass

    def extra(self) -> dict[str, Any]:
        """What a money run's worker is given: the billing provider, a short timeout, and an
        answer of at most 64 tokens."""
        return {
            "provider_url": self.provider.openai_url,
            "provider_timeout": CLIENT_TIMEOUT,
            "max_tokens": 64,
        }

    def prepare(self, trial: int) -> tuple[str, Decimal]:
        """The low price from now on and the subject's money budget; what it counts already."""
        self._set_price(LOW)
        self.changes_before = self.price_changes
        job, subject = "chaos", trial_identity(trial).subject_id
        with LedgerAdmin(self.url) as admin:
            budget = Budget(amount=CAP, unit="money", period="day", scope="subject")
            admin.set_budget(budget, job_name=job)
        budget_id = f"subject:money/day:{job}"
        return budget_id, self._counter(budget_id, subject)[0]

    def check(self, trial: int, budget_id: str, spent_before: Decimal, verdict: Verdict) -> None:
        subject = trial_identity(trial).subject_id
        run_ids = [trial_identity(trial, hour).run_id for hour in HOURS]
        spent, reserved, in_doubt = self._counter(budget_id, subject)
        with psycopg.connect(self.url, autocommit=True) as conn:
            holds = conn.execute(
                "SELECT count(*) FROM idempotent_jobs.budget_holds WHERE run_id = ANY(%s)",
                (run_ids,),
            ).fetchone()
            held = conn.execute(
                "SELECT count(*) FROM idempotent_jobs.runs WHERE run_id = ANY(%s)"
                " AND lease_owner IS NOT NULL",
                (run_ids,),
            ).fetchone()
            calls = conn.execute(
                "SELECT COALESCE(sum(money) FILTER (WHERE billing <> 'in_doubt'), 0),"
                " count(*), count(*) FILTER (WHERE billing = 'in_doubt'),"
                " count(*) FILTER (WHERE money IS NULL AND billing <> 'in_doubt'),"
                " count(*) FILTER (WHERE billing = 'unbilled')"
                " FROM idempotent_jobs.model_calls WHERE run_id = ANY(%s)",
                (run_ids,),
            ).fetchone()
            refused = conn.execute(
                "SELECT count(*) FROM idempotent_jobs.run_attempts WHERE run_id = ANY(%s)"
                " AND outcome = 'budget'",
                (run_ids,),
            ).fetchone()
            doubts = conn.execute(
                "SELECT COALESCE(sum(amount), 0) FROM idempotent_jobs.budget_doubts"
                " WHERE budget_id = %s AND subject_id = %s",
                (budget_id, subject),
            ).fetchone()
        assert holds is not None and held is not None and calls is not None and doubts
        assert refused is not None
        money, recorded, doubtful, unpriced, unbilled = calls
        seen = {
            "unbilled": unbilled,
            "in_doubt": doubtful,
            "refused": refused[0],
            "repriced": self.price_changes - self.changes_before,
        }
        verdict.kind += ":" + "+".join(f"{k}={n}" for k, n in seen.items() if n)
        received = sum(
            1
            for r in self.provider.requests
            if json.loads(r.body["messages"][1]["content"]).get("trial") == trial
        )
        problems = verdict.problems
        # The budget started with the day's spend of its subject so far (the trial's token
        # part's calls, at their admitted price): what this part added never passes the cap,
        # and adds nothing when that spend had passed it already.
        if spent + in_doubt > max(CAP, spent_before):
            problems.append(f"money: {spent} spent and {in_doubt} in doubt of a {CAP} budget")
            problems.append(f"money: before the trial {spent_before}; calls {self._calls(run_ids)}")
        if reserved != 0 or holds[0] or held[0]:
            problems.append(
                f"money: left held: {reserved} reserved, {holds[0]} holds, {held[0]} runs"
            )
        if received != recorded:
            problems.append(
                f"money: the provider received {received} requests, {recorded} recorded"
            )
        if unpriced:
            problems.append(f"money: {unpriced} call(s) recorded with no money and not in doubt")
        if spent - spent_before != money:
            problems.append(f"money: the budget counts {spent - spent_before}, the calls {money}")
        if in_doubt != doubts[0]:
            problems.append(f"money: {in_doubt} in doubt, the calls in doubt hold {doubts[0]}")
        with LedgerAdmin(self.url) as admin:
            shown = sum(  # what `runs show` says each run's calls cost
                (m for r in run_ids for m in admin.call_costs(r).values() if m is not None),
                Decimal(0),
            )
            if shown != spent - spent_before:
                problems.append(f"money: runs show says {shown}, the budget {spent - spent_before}")
            listed = [c for c in admin.calls_in_doubt("chaos", 10_000) if c["run_id"] in run_ids]
            if len(listed) != doubtful:
                problems.append(f"money: {doubtful} calls in doubt, {len(listed)} listed")
            for call in listed:  # the provider's usage page says: not billed
                admin.settle_call(call["call_id"], input_tokens=0, output_tokens=0)
            after = self._counter(budget_id, subject)
            if after != (spent, Decimal(0), Decimal(0)):
                problems.append(f"money: after settling {after}, not ({spent}, 0, 0)")
            admin.clear_budget(budget_id)

    def _calls(self, run_ids: list[str]) -> list[tuple[Any, ...]]:
        """Each call of the trial as recorded (what a failure says)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(
                "SELECT c.run_id = ANY(%s), c.lease_epoch, c.turn, c.outcome, c.billing,"
                " c.price_id, c.money, c.input_tokens, c.output_tokens, c.called_at"
                " FROM idempotent_jobs.model_calls c JOIN idempotent_jobs.runs r USING (run_id)"
                " WHERE r.subject_id = (SELECT subject_id FROM idempotent_jobs.runs"
                "  WHERE run_id = %s) ORDER BY c.call_id",
                (run_ids, run_ids[0]),
            ).fetchall()

    def _counter(self, budget_id: str, subject: str) -> tuple[Decimal, Decimal, Decimal]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT COALESCE(sum(spent), 0), COALESCE(sum(reserved), 0),"
                " COALESCE(sum(in_doubt), 0) FROM idempotent_jobs.budget_counters"
                " WHERE budget_id = %s AND subject_id = %s",
                (budget_id, subject),
            ).fetchone()
        assert row is not None
        return row[0], row[1], row[2]
