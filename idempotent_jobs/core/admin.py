"""The ledger's operator face: what operators, ``doctor``, the CLI and the Dagster admin jobs
(reconciliation, retention) do with a ledger.

Listings and reads (which the reader role can run), revisions, failure drills armed and ended,
migrate and upgrade, privileges, prices and spend, and retention's batches. Its statements are
the ``-- faces: admin`` ones of the stores' files (``sql/<store>.sql``), and only those; the
worker's path (claim, checkpoint, commit, fail, deliver) is the other
face, :class:`~idempotent_jobs.core.ledger.RunLedger`.
"""

import os
from collections.abc import Collection, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from idempotent_jobs.core.budgets import Budget, BudgetStanding
from idempotent_jobs.core.checks import (
    MAX_REASON_CHARS,
    check_channel,
    check_job_names,
    check_limit,
    optional_name,
)
from idempotent_jobs.core.costs import (
    STANDARD_TIER,
    JobHistory,
    JobSpend,
    ModelPrice,
    check_currency,
    check_effective_from,
    check_price,
)
from idempotent_jobs.core.errors import InvalidInputError, RunNotFoundError
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.privilege_checks import RoleAbilities
from idempotent_jobs.core.rate_limits import RateLimit
from idempotent_jobs.core.records import (
    AttemptRecord,
    DrillRecord,
    JobConfig,
    ModelCallRecord,
    OutboxRecord,
    PruneBatch,
    RevisionRecord,
    RunRecord,
    RunStatus,
    StoredPart,
    StoredTable,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.schema import AppliedMigration
from idempotent_jobs.core.upgrade import MigrationReport


class LedgerAdmin(LedgerFace):
    """The operator face of a ledger: ``LedgerAdmin(conninfo, **settings)`` or
    ``LedgerAdmin(LedgerSettings(...))`` (see :class:`~idempotent_jobs.core.face.LedgerFace`).
    ``LedgerAdmin.beside(ledger)`` is one with a worker face's settings (its own pool)."""

    face = "admin"

    @classmethod
    def beside(cls, ledger: LedgerFace) -> "LedgerAdmin":
        """The operator face of the ledger ``ledger`` reaches (the same settings, a pool of its
        own, opened on first use: close it, or use a ``with`` block)."""
        return cls(ledger.settings)

    # -- schema and roles --------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply missing migrations and the upgrade steps (idempotent, serialised by an advisory
        lock); return the migrations applied now. :meth:`upgrade` says what else it did."""
        return self._db.migrate().applied

    def upgrade(self, split_roles: bool = False) -> MigrationReport:
        """:meth:`migrate`, returning its whole report: the migrations applied, what was done
        besides (identities normalised, grants) and what an operator should look at.
        ``split_roles``: from now on the worker role only reads prices, budgets and limits,
        which the operator role sets (:mod:`idempotent_jobs.core.grants`)."""
        return self._db.migrate(split_roles)

    def role_abilities(self) -> RoleAbilities:
        """The connected role, the ledger's group roles it belongs to and what it may do."""
        return self._db.abilities()

    def missing_privileges(self) -> tuple[str, list[str]]:
        """The connected role's name, and what it lacks of the privileges workers need
        (``PRIVILEGE on schema.table``; empty when it has them all)."""
        return self._db.privileges()

    def migrations_ahead(self) -> list[AppliedMigration]:
        """The applied migrations this code does not ship (a later release's: the mixed window
        of a rolling upgrade, while workers of this release still run)."""
        return self._db.migrations_ahead()

    # -- reads -------------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of a run, or ``None``."""
        rows = self._db.fetch("get_run", {"run_id": run_id}, record_row(RunRecord))
        return rows[0] if rows else None

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every successful claim of the run, oldest first."""
        return self._db.fetch("list_attempts", {"run_id": run_id}, record_row(AttemptRecord))

    def model_calls(self, run_id: str) -> list[ModelCallRecord]:
        """Every recorded model call of the run, oldest first (see :class:`CallCosts`)."""
        return self._db.fetch("list_model_calls", {"run_id": run_id}, record_row(ModelCallRecord))

    def outbox(
        self,
        run_id: str | None = None,
        *,
        pending_only: bool = False,
        limit: int = 1000,
        job_names: Collection[str] | None = None,
    ) -> list[OutboxRecord]:
        """Outbox rows, optionally of one run, of the identity jobs ``job_names``, and/or only
        those not delivered yet."""
        params = {
            "run_id": run_id,
            "pending_only": pending_only,
            "limit": check_limit(limit),
            "job_names": check_job_names(job_names),
        }
        return self._db.fetch("list_outbox", params, record_row(OutboxRecord))

    def revisions(self, run_id: str) -> list[RevisionRecord]:
        """The accepted results a run had before each explicit revision, oldest first."""
        return self._db.fetch("list_revisions", {"run_id": run_id}, record_row(RevisionRecord))

    def drills(self) -> list[DrillRecord]:
        """The drills still armed."""
        return self._db.fetch("list_drills", {}, record_row(DrillRecord))

    def job_names(self) -> list[str]:
        """The identity job names of the runs in the ledger, in order."""
        return [name for (name,) in self._db.rows("job_names", {})]

    def list_runs(
        self,
        *,
        job_name: str | None = None,
        subject_id: str | None = None,
        status: RunStatus | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = 100,
        after: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest window first (``limit=None``: all); ``since``/``until`` bound the
        window start, ``until`` exclusive. ``job_name`` and ``subject_id`` are compared as the
        identity stores them (stripped, Unicode NFC).

        ``after`` (a run id or a unique prefix of one, usually the last run of the previous
        page) continues the listing after that run: pages by keyset, as cheap on the
        thousandth page as on the first."""
        params = {
            "after": None if after is None else self.resolve_run_id(after),
            "job_name": None if job_name is None else normalize_text(job_name),
            "subject_id": None if subject_id is None else normalize_text(subject_id),
            "status": status,
            "since": since,
            "until": until,
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("list_runs", params, record_row(RunRecord))

    def resolve_run_id(self, prefix: str) -> str:
        """The one run id starting with ``prefix`` (hex); raise if none or several match."""
        prefix = prefix.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix) or len(prefix) > 64:
            raise InvalidInputError("run_id", f"{prefix!r} is not a run id or a hex prefix of one")
        matches = [r[0] for r in self._db.rows("run_ids_by_prefix", {"prefix": prefix})]
        if len(matches) != 1:
            many = "several runs" if matches else "no run"
            raise RunNotFoundError(f"run id prefix {prefix!r} matches {many}")
        return str(matches[0])

    def drifted(
        self, job_name: str, version: str, config: JobConfig, *, limit: int = 1000
    ) -> list[RunRecord]:
        """Completed runs of ``job_name``/``version`` whose result was computed under another
        configuration than ``config`` (newest window first)."""
        params = {
            "job_name": normalize_text(job_name),
            "version": normalize_text(version),
            "config_fingerprint": config.fingerprint,
            "limit": check_limit(limit),
        }
        return self._db.fetch("drifted_runs", params, record_row(RunRecord))

    def expired_leases(self, limit: int | None = None) -> list[RunRecord]:
        """Running runs whose lease expired (by the database clock) without completion, the
        longest expired first (``limit``: at most that many)."""
        params = {"limit": None if limit is None else check_limit(limit)}
        return self._db.fetch("expired_leases", params, record_row(RunRecord))

    def stale_outbox(
        self, older_than_seconds: float, limit: int | None = None
    ) -> list[OutboxRecord]:
        """Undelivered notifications queued more than ``older_than_seconds`` ago, oldest
        first."""
        params = {
            "older_than_seconds": float(older_than_seconds),
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("stale_outbox", params, record_row(OutboxRecord))

    def failed_past_retries(self, max_attempts: int, limit: int | None = None) -> list[RunRecord]:
        """Failed runs that have used ``max_attempts`` claims or more, the longest failed
        first."""
        params = {
            "max_attempts": max_attempts,
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("failed_past_retries", params, record_row(RunRecord))

    def storage(
        self, exact_below_rows: int = 200_000
    ) -> tuple[list[StoredTable], list[StoredPart]]:
        """What the ledger holds: each table's estimated rows and bytes on disk, and per job
        the rows and stored bytes of runs, raw inputs, outputs, attempts and outbox payloads.
        Exact for tables under ``exact_below_rows`` rows (by the catalogue's estimate); over
        that, estimated from a sample of about that many rows' pages."""
        tables = self._db.fetch("storage_tables", {"schema": self.schema}, record_row(StoredTable))
        estimated = {t.table_name: t.estimated_rows or 0 for t in tables}
        parts: list[StoredPart] = []

        def percent(table: str) -> float:
            rows = estimated.get(table, 0)
            return 100.0 if rows < exact_below_rows else 100.0 * exact_below_rows / rows

        def add(part: str, job: str, rows: int, size: int, sampled_percent: float) -> None:
            scale = 100.0 / sampled_percent
            parts.append(
                StoredPart(
                    job_name=job,
                    part=part,
                    rows=round(rows * scale),
                    bytes=round(size * scale),
                    estimated=scale > 1,
                )
            )

        runs_percent = percent("runs")
        for job, rows, row_bytes, raw_bytes, output_bytes in self._db.rows(
            "storage_runs", {"percent": runs_percent}
        ):
            add("runs", job, rows, row_bytes, runs_percent)
            add("runs.raw_input", job, rows, raw_bytes, runs_percent)
            add("runs.output", job, rows, output_bytes, runs_percent)
        attempts_percent = percent("run_attempts")
        for job, rows, size in self._db.rows("storage_attempts", {"percent": attempts_percent}):
            add("run_attempts", job, rows, size, attempts_percent)
        outbox_percent = percent("notification_outbox")
        for job, rows, size in self._db.rows("storage_outbox", {"percent": outbox_percent}):
            add("notification_outbox.payload", job, rows, size, outbox_percent)
        order = ["runs", "runs.raw_input", "runs.output", "run_attempts"]
        parts.sort(key=lambda p: (p.job_name, order.index(p.part) if p.part in order else 9))
        return tables, parts

    # -- revisions ---------------------------------------------------------------------------

    def revise(
        self,
        run_id: str,
        reason: str,
        *,
        channels: Sequence[str] = (),
        recollect: bool = False,
        requested_by: str | None = None,
    ) -> RunRecord:
        """Reopen a completed run for recomputation: the only way a result is ever replaced.

        The accepted output moves to ``run_revisions`` with ``reason``; the run becomes pending
        under the next revision, keeping its raw input unless ``recollect`` (required when
        retention pruned the raw input). The next completion
        queues notifications only for ``channels`` (none: the new result is stored silently).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("reason", "must say why the result is recomputed")
        if len(reason.strip()) > MAX_REASON_CHARS:
            raise InvalidInputError("reason", f"must be at most {MAX_REASON_CHARS} characters")
        if isinstance(channels, str):
            raise InvalidInputError("channels", "must be a list of channel names, not one string")
        for channel in channels:
            check_channel("channels", channel)
        params = {
            "run_id": run_id,
            "reason": reason.strip(),
            "channels": list(dict.fromkeys(channels)),
            "recollect": bool(recollect),
            "requested_by": optional_name("requested_by", requested_by),
        }
        rows = self._db.fetch("revise", params, record_row(RunRecord))
        if rows:
            return rows[0]
        record = self.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        if record.status == "completed" and record.raw_input_pruned_at is not None:
            raise InvalidInputError(
                "recollect",
                f"the raw input of run {run_id} was pruned "
                f"{record.raw_input_pruned_at.isoformat(timespec='seconds')}: revise it with "
                "recollect (--recollect) to collect the input again",
            )
        raise InvalidInputError(
            "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
        )

    # -- failure drills ------------------------------------------------------------------------

    def arm_drill(
        self, job_name: str, calls: int, seconds: float, *, armed_by: str | None = None
    ) -> DrillRecord:
        """Make the next ``calls`` model calls of ``job_name`` (identity job name; ``*``: every
        job) fail on purpose, for at most ``seconds``; every worker sees it."""
        if not isinstance(calls, int) or isinstance(calls, bool) or not 0 < calls <= 10**7:
            raise InvalidInputError(
                "calls", f"must be a whole number from 1 to 10^7, got {calls!r}"
            )
        if not (isinstance(seconds, int | float) and 0 < seconds <= 10 * 366 * 86400):
            raise InvalidInputError("seconds", f"must be from 0 to ten years, got {seconds!r}")
        params = {
            "job_name": normalize_text(job_name) if job_name != "*" else "*",
            "calls": calls,
            "seconds": float(seconds),
            "armed_by": optional_name("armed_by", armed_by),
        }
        [drill] = self._db.fetch("arm_drill", params, record_row(DrillRecord))
        return drill

    def disarm_drills(self, job_name: str | None = None) -> list[DrillRecord]:
        """End the drill of ``job_name`` (every drill when ``None``); return those ended."""
        params = {"job_name": job_name}
        return self._db.fetch("disarm_drills", params, record_row(DrillRecord))

    # -- prices and spend ----------------------------------------------------------------------

    def set_rate_limit(self, limit: RateLimit) -> dict[str, Any]:
        """Set a provider rate limit as the operator (it stands over a spec's declaration);
        every worker of every deployment keeps it within half a minute."""
        [row] = self._db.fetch("set_rate_limit", limit.params(), dict_row)
        return row

    def delete_rate_limit(self, provider: str, model: str, key_name: str = "") -> bool:
        """Remove a rate limit; whether there was one."""
        params = {"provider": provider, "model": model, "key_name": key_name}
        return bool(self._db.rows("delete_rate_limit", params))

    def batches(
        self,
        *,
        batch_id: str | None = None,
        job_name: str | None = None,
        state: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Batches of the batch lane, newest first, with their items by state and their money
        (at the price in force for each call; ``unpriced`` calls make it a floor)."""
        params = {"batch_id": batch_id, "job_name": job_name, "state": state, "limit": limit}
        return self._db.fetch("list_batches", params, dict_row)

    def batch_id_of(self, prefix: str) -> str:
        """The batch whose id starts with ``prefix`` (as ``batches list`` shows ids, from 4 hex
        digits); :class:`InvalidInputError` naming ``batch_id`` when none does, or several."""
        text = prefix.strip().lower()
        if not 4 <= len(text) <= 32 or any(c not in "0123456789abcdef" for c in text):
            raise InvalidInputError(
                "batch_id", f"{prefix!r} is not a batch id (4 to 32 hex digits)"
            )
        found = [row[0] for row in self._db.rows("batch_ids_like", {"prefix": text})]
        if not found:
            raise InvalidInputError("batch_id", f"no batch {prefix!r}")
        if len(found) > 1:
            raise InvalidInputError(
                "batch_id", f"{prefix!r} starts {len(found)} batch ids: give more of it"
            )
        return str(found[0])

    def batch_runs(self, batch_id: str) -> list[dict[str, Any]]:
        """A batch's runs: each item's run, subject, state, error and recorded call."""
        return self._db.fetch("batch_runs", {"batch_id": batch_id}, dict_row)

    def cancel_batch(self, batch_id: str, requested_by: str | None = None) -> dict[str, Any]:
        """Ask for the batch to be cancelled: its lane cancels it at the provider at its next
        step, accepts what was answered and releases the rest (their runs go online or into
        another batch). :class:`InvalidInputError` naming ``batch_id`` when there is no such
        batch or it has ended."""
        rows = self._db.fetch(
            "request_batch_cancel",
            {"batch_id": batch_id, "requested_by": requested_by},
            dict_row,
        )
        if not rows:
            raise InvalidInputError("batch_id", f"no open batch {batch_id!r} to cancel")
        return rows[0]

    def rate_limits(self) -> list[dict[str, Any]]:
        """Every provider rate limit, as rows (who declared it: a job's name, or ``operator``)."""
        return self._db.fetch("list_rate_limits", {}, dict_row)

    def set_price(
        self,
        model_name: str,
        input_per_million: object,
        output_per_million: object,
        *,
        currency: str = "USD",
        cache_read_per_million: object = None,
        cache_write_per_million: object = None,
        cache_write_1h_per_million: object = None,
        reasoning_per_million: object = None,
        tier: str = STANDARD_TIER,
        prefix: bool = False,
        effective_from: datetime | None = None,
        set_by: str | None = None,
    ) -> ModelPrice:
        """Set ``model_name``'s price per million tokens of each kind (the parts left ``None``
        fall back to the input or output price), in force from ``effective_from`` (now) on:
        earlier calls keep the price they were made under. ``prefix``: for every model whose
        name starts with ``model_name`` (an exact name's price wins over it). ``tier``: a
        service tier's own price (``batch``). Every price is in the ledger's one currency: the
        first sets it, and another is refused (by the database, whatever races it)."""
        name = model_name.strip()
        if not name or len(name) > 200 or not name.isprintable():
            raise InvalidInputError("model", f"must be a printable model name, got {model_name!r}")
        tier_name = tier.strip()
        if not tier_name or len(tier_name) > 40 or not tier_name.isprintable():
            raise InvalidInputError("tier", f"must be a tier name such as batch, got {tier!r}")
        code = check_currency(currency)
        parts = {
            "cache_read_per_million": cache_read_per_million,
            "cache_write_per_million": cache_write_per_million,
            "cache_write_1h_per_million": cache_write_1h_per_million,
            "reasoning_per_million": reasoning_per_million,
        }
        params = {
            "model_pattern": name,
            "match_kind": "prefix" if prefix else "exact",
            "tier": tier_name,
            "effective_from": check_effective_from(effective_from),
            "input_per_million": check_price("input_per_million", input_per_million),
            "output_per_million": check_price("output_per_million", output_per_million),
            **{k: None if v is None else check_price(k, v) for k, v in parts.items()},
            "currency": code,
            "set_by": set_by,
        }
        try:
            [row] = self._db.fetch("set_price", params, dict_row)
        except psycopg.errors.ForeignKeyViolation:
            held = self.currency()
            raise InvalidInputError(
                "currency", f"the ledger's prices are in {held}; got {code}"
            ) from None
        except psycopg.errors.UniqueViolation:
            raise InvalidInputError(
                "from",
                f"{name} ({tier_name}) has a price from that time already; price history is "
                "never rewritten: set the new price from another time (now, by default)",
            ) from None
        blocked = row.pop("blocked_at")
        if blocked is not None:
            raise InvalidInputError(
                "from",
                f"calls of {name} were priced since then (the first at {blocked:%Y-%m-%d %H:%M} "
                "UTC): a price from the past would rewrite what they cost; set it from now on",
            )
        row.pop("priced_calls")
        return ModelPrice(**row)

    def currency(self) -> str | None:
        """The ledger's currency (``None`` before the first price is set)."""
        rows = self._db.rows("ledger_currency", {})
        return str(rows[0][0]) if rows else None

    def delete_prices(
        self, model_name: str, *, prefix: bool = False, tier: str | None = None
    ) -> list[ModelPrice]:
        """Remove a model's (or prefix's) prices, of ``tier`` or every tier, when none of them
        priced a call (a mistyped price, say); a price that priced calls is history, and the
        whole removal is refused (:class:`InvalidInputError`). Returns what was removed."""
        params = {
            "model_pattern": model_name.strip(),
            "match_kind": "prefix" if prefix else "exact",
            "tier": tier,
        }
        rows = self._db.fetch("delete_prices", params, dict_row)
        kept = [r for r in rows if r["kept"]]
        if kept:
            first = kept[0]
            raise InvalidInputError(
                "model",
                f"{len(kept)} price(s) of {model_name.strip()!r} priced calls (the first from "
                f"{first['effective_from']:%Y-%m-%d %H:%M} UTC, {first['tier']}): price history "
                "is kept; set a new price from now on instead",
            )
        return [
            ModelPrice(**{k: v for k, v in r.items() if k not in ("kept", "removed")}) for r in rows
        ]

    def prices(self) -> list[ModelPrice]:
        """Every price with its history, by model, tier and the time it applies from."""
        return self._db.fetch("list_prices", {}, record_row(ModelPrice))

    def price_matches(self, days: int = 30) -> list[dict[str, Any]]:
        """Which calls of the last ``days`` days each price priced (a row whose
        ``model_pattern`` is ``None``: calls no price covers, and their models)."""
        return self._db.fetch("price_matches", {"days": days}, dict_row)

    def call_costs(self, run_id: str) -> dict[int, Decimal | None]:
        """What each of a run's calls cost, by call id, at the price in force when it was made
        (``None``: unknown)."""
        rows = self._db.rows("call_costs", {"run_id": run_id})
        return {int(call_id): cost for call_id, cost in rows}

    def spend_by_job(self, day: datetime | None = None) -> list[JobSpend]:
        """Each job's spend in the UTC day holding ``day`` (today, by the database clock)."""
        return self._db.fetch("spend_by_job", {"day": day}, record_row(JobSpend))

    def spend_by_kind(
        self, start: datetime, end: datetime, job_name: str | None = None
    ) -> list[dict[str, Any]]:
        """What each job's calls from ``start`` to ``end`` spent, by model, price in force and
        kind of token (input, cache read, cache write, cache write 1h, output, reasoning)."""
        params = {"start": start, "end": end, "job_name": job_name}
        return self._db.fetch("spend_by_kind", params, dict_row)

    def spend_totals(
        self, start: datetime, end: datetime, job_name: str | None = None
    ) -> dict[str, Any]:
        """What the calls from ``start`` to ``end`` cost in all (the money each was recorded
        with), whether every call not in doubt was priced, and the calls in doubt and not
        billed, counted apart."""
        params = {"start": start, "end": end, "job_name": job_name}
        [row] = self._db.fetch("spend_totals", params, dict_row)
        return row

    def calls_in_doubt(self, job_name: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The calls whose outcome is in doubt (a timeout after the request was sent, a cut
        connection: no usage known), oldest first, with what each holds of each budget."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInputError("limit", f"must be 1 to 10,000, got {limit!r}")
        return self._db.fetch("calls_in_doubt", {"job_name": job_name, "limit": limit}, dict_row)

    def settle_call(
        self,
        call_id: int,
        *,
        input_tokens: int,
        output_tokens: int,
        settled_by: str | None = None,
    ) -> dict[str, Any]:
        """Settle a call in doubt with the provider's figure: the tokens it billed (0 and 0:
        not billed), priced at the price row its request was admitted at. What it held of each
        budget in doubt becomes spend. Refused (:class:`InvalidInputError`) for a call that
        is not in doubt or does not exist: a settled figure is never changed again."""
        for name, value in (("call_id", call_id), ("input_tokens", input_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(name, f"must be a whole number from 0, got {value!r}")
        if isinstance(output_tokens, bool) or not isinstance(output_tokens, int):
            raise InvalidInputError(
                "output_tokens", f"must be a whole number, got {output_tokens!r}"
            )
        if output_tokens < 0 or max(input_tokens, output_tokens) > 10**12:
            raise InvalidInputError(
                "output_tokens" if output_tokens < 0 else "input_tokens",
                "must be from 0 to 10^12 tokens",
            )
        params = {
            "call_id": call_id,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "settled_by": settled_by,
        }
        [row] = self._db.fetch("settle_doubt", params, dict_row)
        if row["outcome"] == "missing":
            raise InvalidInputError("call_id", f"no model call {call_id}")
        if row["outcome"] == "not_in_doubt":
            raise InvalidInputError(
                "call_id",
                f"call {call_id} is not in doubt (it is {row['billing']}): nothing to settle",
            )
        return {"call_id": call_id, **row}

    def budgets(self, job_name: str | None = None) -> list[BudgetStanding]:
        """Every budget the ledger holds (those covering ``job_name``), with where its
        current period stands: what every worker enforces."""
        return self._db.fetch(
            "budget_standings", {"job_name": job_name}, record_row(BudgetStanding)
        )

    def set_budget(
        self, budget: Budget, *, job_name: str | None = None, jobs: Sequence[str] = ()
    ) -> BudgetStanding:
        """Set a budget as the operator (it stands over a spec's declaration): of ``job_name``
        for a job or subject budget, of the group's ``jobs`` for a group budget. A new budget
        starts with what its period has spent already."""
        if budget.scope == "group":
            members = sorted({normalize_text(j) for j in jobs})
            if not members:
                raise InvalidInputError("jobs", "a group budget needs the jobs it covers")
            name = budget.scope_name("")
        else:
            if not job_name or not job_name.strip():
                raise InvalidInputError("job", f"a {budget.scope} budget needs its job's name")
            name = normalize_text(job_name)
            members = [name]
        params = {
            "budget_id": budget.budget_id(name),
            "scope": budget.scope,
            "scope_name": budget.scope_name(name),
            "unit": budget.unit,
            "period": budget.period,
            "amount": budget.amount,
            "jobs": members,
            "set_by": os.environ.get("USER"),
        }
        [(budget_key, _inserted)] = self._db.rows("set_budget", params)
        [standing] = [b for b in self.budgets() if b.budget_id == budget_key]
        return standing

    def clear_budget(self, budget_id: str) -> bool:
        """Remove a budget (``job:tokens/day:<job>``): whether there was one."""
        return bool(self._db.rows("clear_budget", {"budget_id": budget_id}))

    def job_history(self, job_name: str, *, sample: int = 1000) -> JobHistory:
        """:class:`JobHistory` of identity job ``job_name``."""
        params = {"job_name": job_name, "sample": sample}
        [row] = self._db.fetch("job_history", params, dict_row)
        return JobHistory(**row)

    def run_sizes(self, run_ids: list[str]) -> dict[str, tuple[str, int | None]]:
        """The status of each of ``run_ids`` the ledger holds and the bytes of its raw-input
        checkpoint (``None``: none kept); unregistered ids are left out."""
        if any("," in run_id for run_id in run_ids):
            raise InvalidInputError("run_ids", "a run id has no comma")
        rows = self._db.rows("run_sizes", {"run_ids": ",".join(run_ids)})
        return {run_id: (status, size) for run_id, status, size in rows}

    def run_statuses(self, run_ids: list[str]) -> dict[str, str]:
        """The status of each of ``run_ids`` the ledger holds (unregistered ids are left out)."""
        rows = self._db.rows("run_statuses", {"run_ids": run_ids})
        return {run_id: status for run_id, status in rows}

    # -- retention -----------------------------------------------------------------------------

    def database_now(self) -> datetime:
        """The database server's clock (retention's cutoffs are computed by it, as leases are)."""
        [(now,)] = self._db.rows("database_now", {})
        assert isinstance(now, datetime)
        return now

    def prune_batch(
        self,
        job_name: str,
        after: tuple[str, datetime, str],
        batch_size: int,
        *,
        raw_input_before: datetime | None,
        output_before: datetime | None,
        attempts_before: datetime | None,
        payloads_before: datetime | None,
        apply: bool,
    ) -> PruneBatch:
        """One retention batch of a job's runs after the identity ``after`` (see
        :func:`idempotent_jobs.core.retention.prune`)."""
        params = {
            "job_name": normalize_text(job_name),
            "after_subject": after[0],
            "after_scheduled_at": after[1],
            "after_version": after[2],
            "batch_size": batch_size,
            "raw_input_before": raw_input_before,
            "output_before": output_before,
            "attempts_before": attempts_before,
            "payloads_before": payloads_before,
            "apply": apply,
        }
        [row] = self._db.rows("prune_batch", params)
        return PruneBatch.of_row(row)

    def prune_spend(self, job_name: str, apply: bool) -> int:
        """A job's spend rows older than the longest budget period (kept: this calendar month
        and the one before): how many, deleted with ``apply``."""
        params = {"job_name": normalize_text(job_name), "apply": apply}
        [(rows,)] = self._db.rows("prune_spend", params)
        return int(rows)

    def prune_step_outputs(
        self, job_name: str, before: datetime, batch_size: int | None, apply: bool
    ) -> tuple[int, int]:
        """One batch of what the ledger IO manager kept between the steps of the job's runs
        completed before ``before`` (``batch_size`` None: count them all): rows and bytes."""
        params = {
            "job_name": normalize_text(job_name),
            "before": before,
            "batch_size": batch_size,
            "apply": apply,
        }
        [(rows, size)] = self._db.rows("prune_step_outputs", params)
        return int(rows), int(size)


__all__ = ["LedgerAdmin"]
