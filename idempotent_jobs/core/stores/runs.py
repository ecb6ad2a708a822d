"""The runs store: a run's identity, registration and lease, its raw-input checkpoint
(``sql/runs.sql``); and the operator's reads of runs (listings, health, sizes)."""

from dataclasses import replace
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from idempotent_jobs.core.checks import (
    JsonPayload,
    caller_params,
    check_identity,
    check_lease_seconds,
    check_limit,
    check_name,
    check_worker_id,
    fence_params,
    identity_params,
)
from idempotent_jobs.core.errors import (
    IdentityConflictError,
    InvalidInputError,
    LeaseLostError,
    LedgerError,
    RunNotFoundError,
)
from idempotent_jobs.core.identity import RunIdentity, normalize_text
from idempotent_jobs.core.records import (
    AdvanceHold,
    CallOrigin,
    FenceOutcome,
    JobConfig,
    Lease,
    RunRecord,
    RunStatus,
)
from idempotent_jobs.core.rows import record_from, record_row
from idempotent_jobs.core.stores.base import Store


def _held(hold: AdvanceHold | None, outcome: str | None, before: int | None) -> int | None:
    """What a lease holds after a write that may have reserved ``hold``: its tokens when the
    budgets admitted it; nothing when they did not; unchanged when none was asked."""
    if hold is None:
        return before
    return hold.max_tokens if outcome == "admitted" else None


class RunsStore(Store):
    """Registration, leases and checkpoints (the worker face); listings of runs (the operator
    face)."""

    def lease_write(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` of a lease-only write plus its commit mode (see ``sql/runs.sql``)."""
        params["lease_commit"] = None if self.settings.durable_lease_commits else "off"
        return params

    def _stored_id_of(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` under the run id stored for their identity fields, after the identity key
        refused them (ON CONFLICT (run_id) arbitrates on the primary key only): a registration
        that raced this one (the same id), or a run an earlier release registered in another
        Unicode form, which migrate put in NFC under its old id (core/upgrade.py)."""
        rows = self._db.rows("run_id_by_identity", params)
        return {**params, "run_id": rows[0][0]} if rows else params

    def begin(
        self,
        identity: RunIdentity,
        worker_id: str,
        lease_seconds: float,
        *,
        origin: CallOrigin | None = None,
        hold: AdvanceHold | None = None,
    ) -> tuple[RunRecord, Lease | None]:
        """Register the run (a new row, or the stored one) and :meth:`claim` it, in one
        statement. Returns the record and the new lease, or the record and ``None`` when the run
        is completed (nothing is written, and the record comes without its checkpoint:
        ``raw_input`` is ``None``, read it with ``LedgerAdmin.get``) or another worker holds it
        (only updated_at moves).
        :class:`IdentityConflictError` when the run id is stored with other identity fields.
        ``origin``: the caller's run and step, recorded with the claim and its attempt.
        ``hold``: the coming model call's worst case, reserved in the same statement when it
        claims and a budget covers the job (``held_tokens`` of the lease, as :meth:`renew`)."""
        lease_seconds = check_lease_seconds(lease_seconds)
        params = self._hold_params(
            {
                **identity_params(identity),
                "worker_id": check_worker_id(worker_id),
                "lease_seconds": lease_seconds,
                **caller_params(origin),
            },
            hold,
        )
        rows: list[dict[str, Any]] = []
        for attempt in range(3):
            # No row: a first registration raced this one, or the run completed while this
            # statement waited for its lock. Either has committed and is seen by the next try.
            try:
                rows = self._db.fetch("begin", params, dict_row)
            except IdentityConflictError:  # see _stored_id_of
                if attempt:
                    raise  # a real conflict raises again
                params = self._stored_id_of(params)
                continue
            if rows:
                break
        if not rows:
            raise LedgerError(f"run {identity.run_id} was deleted while being registered")
        claimed = rows[0]["claimed"]
        record = record_from(RunRecord, rows[0])
        check_identity(record, identity)
        if not claimed:
            return record, None
        lease = Lease(
            run_id=record.run_id,
            worker_id=worker_id,
            epoch=record.lease_epoch,
            expires_at=record.lease_expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=record.raw_input,
            attempts=record.attempts,
            revision=record.revision,
            input_fingerprint=record.input_fingerprint,
            drill_armed=rows[0]["drill_armed"],
            budgeted=rows[0]["budgeted"],
            held_tokens=_held(hold, rows[0]["held"], None),
        )
        return record, lease

    def claim(
        self,
        run_id: str,
        worker_id: str,
        lease_seconds: float,
        *,
        origin: CallOrigin | None = None,
    ) -> Lease | None:
        """Take the run's lease; ``None`` if another worker holds it or the run is completed."""
        lease_seconds = check_lease_seconds(lease_seconds)
        rows = self._db.rows(
            "claim",
            self.lease_write(
                {
                    "run_id": run_id,
                    "worker_id": check_worker_id(worker_id),
                    "lease_seconds": lease_seconds,
                    **caller_params(origin),
                }
            ),
        )
        if not rows:
            return None
        epoch, expires_at, raw_input, attempts, revision, fingerprint = rows[0]
        return Lease(
            run_id=run_id,
            worker_id=worker_id,
            epoch=epoch,
            expires_at=expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
        )

    def _hold_params(self, params: dict[str, Any], hold: AdvanceHold | None) -> dict[str, Any]:
        """``params`` of a lease write that may carry an :class:`AdvanceHold`. The hold commits
        as the lease does (``durable_lease_commits``): one lost in a server crash takes the
        lease write with it, and the call it admitted, if made, is charged when recorded."""
        return {
            **self.lease_write(params),
            "hold_tokens": None if hold is None else hold.max_tokens,
            "requested": None if hold is None else hold.requested_model,
        }

    def renew(
        self, lease: Lease, *, hold: AdvanceHold | None = None, step: str | None = None
    ) -> Lease:
        """Extend the lease by its duration from now (database clock); raise if it was lost.

        Also how a later step (another process, even) takes over a lease handed on to it: the
        owner and epoch are the capability, and the returned lease carries the checkpoint.
        ``hold``: reserve the coming model call's worst case in the same statement
        (``held_tokens`` of the returned lease says whether it was admitted; one that was not
        is left for the call to reserve, and refuse, itself). ``step``: the step taking the
        lease over (a handover), which the attempt then names.
        """
        params = self._hold_params(
            {
                **fence_params(lease),
                "lease_seconds": lease.lease_seconds,
                "caller_step": None if step is None else check_name("step", step),
            },
            hold,
        )
        rows = self._db.rows("renew", params)
        if not rows:
            raise LeaseLostError()
        expires_at, raw_input, attempts, revision, fingerprint, _, held = rows[0]
        return replace(
            lease,
            expires_at=expires_at,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
            held_tokens=_held(hold, held, lease.held_tokens),
        )

    def input_payload(self, raw_input: object) -> JsonPayload:
        """``raw_input`` checked and serialised once, as :meth:`checkpoint` stores it;
        :class:`InvalidInputError` naming ``raw_input`` if it could not be (nothing is
        written)."""
        return JsonPayload.of(raw_input, "raw_input", self.settings.max_raw_input_bytes)

    def checkpoint(
        self,
        lease: Lease,
        raw_input: dict[str, Any] | JsonPayload,
        *,
        hold: AdvanceHold | None = None,
    ) -> Lease:
        """Checkpoint the collected input; the first stored value wins. Returns the lease with
        the stored checkpoint and its fingerprint: the :class:`Basis` of an answer computed on
        it. ``raw_input``: the value, or the :meth:`input_payload` made of it. ``hold``: as for
        :meth:`renew`."""
        raw = raw_input if isinstance(raw_input, JsonPayload) else self.input_payload(raw_input)
        params = self._hold_params(
            {**fence_params(lease), "raw_input": raw.text, "input_fingerprint": raw.fingerprint},
            hold,
        )
        rows = self._db.rows("save_raw_input", params)
        if not rows:
            raise LeaseLostError()
        stored, fingerprint, _, held = rows[0]
        return replace(
            lease,
            stored_raw_input=stored,
            input_fingerprint=fingerprint,
            held_tokens=_held(hold, held, lease.held_tokens),
        )

    def release(self, lease: Lease) -> FenceOutcome:
        """Give the lease back untouched (the attempt ends ``superseded``), for a step that stops
        early; ``applied``, ``already_done`` (this release landed before), or LeaseLostError."""
        return self._fenced("release", self.lease_write(fence_params(lease)))

    def _fenced(self, name: str, params: dict[str, Any]) -> FenceOutcome:
        """Run fenced statement ``name``; its outcome, or :class:`LeaseLostError`."""
        rows = self._db.rows(name, params)
        outcome = FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST
        if outcome == FenceOutcome.LEASE_LOST:
            raise LeaseLostError()
        return outcome

    def job_of(self, run_id: str) -> str:
        """The identity job of a registered run; :class:`RunNotFoundError` if there is none."""
        rows = self._db.fetch("run_job", {"run_id": run_id}, dict_row)
        if not rows:
            raise RunNotFoundError(f"run {run_id} is not registered")
        return str(rows[0]["job_name"])

    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of a run, or ``None``."""
        rows = self._db.fetch("get_run", {"run_id": run_id}, record_row(RunRecord))
        return rows[0] if rows else None

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

    def failed_past_retries(self, max_attempts: int, limit: int | None = None) -> list[RunRecord]:
        """Failed runs that have used ``max_attempts`` claims or more, the longest failed
        first."""
        params = {
            "max_attempts": max_attempts,
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("failed_past_retries", params, record_row(RunRecord))

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

    def database_now(self) -> datetime:
        """The database server's clock (retention's cutoffs are computed by it, as leases are)."""
        [(now,)] = self._db.rows("database_now", {})
        assert isinstance(now, datetime)
        return now
