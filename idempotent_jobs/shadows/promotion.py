"""Promoting a compared shadow: its version becomes the job's for new windows (its gate opens),
and with ``revise`` each run whose answer changed is revised and the shadow's answer accepted
under the new revision through the fenced commit, without calling the model again: one
notification per changed run and channel, under its revision's key; none for the others.

Every step can be cut and run again: a run is revised only while it is still on the revision
and checkpoint the shadow computed on (else its answer is stale and left out), a run this
shadow revised is recognised by its revision's ``requested_by``, and an answer accepted before
a crash is only marked."""

from collections.abc import Sequence
from typing import Any

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.commits import commit
from idempotent_jobs.core.errors import (
    InvalidInputError,
    LeaseLostError,
    LedgerConnectionError,
    StaleCandidateError,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Basis, CallOrigin, ModelUsage, ShadowLease
from idempotent_jobs.core.steps import BoundAnswer
from idempotent_jobs.shadows.job import ShadowRule, ShadowSteps
from idempotent_jobs.shadows.lane import SHADOW_LEASE_SECONDS, progress

#: How long a promotion holds a run it accepts an answer for.
RUN_LEASE_SECONDS = 120.0


def promote(
    ledger: RunLedger,
    admin: LedgerAdmin,
    steps: ShadowSteps,
    shadow_id: str,
    *,
    worker_id: str,
    revise: bool = False,
    channels: Sequence[str] | None = None,
    force: bool = False,
    lease_seconds: float = SHADOW_LEASE_SECONDS,
) -> dict[str, Any]:
    """Promote the compared shadow (see the module); a promotion cut short is taken up again
    by the next call. Refused (:class:`InvalidInputError`) before anything is written when the
    shadow is not compared, or does not meet the job's rule (unless ``force``). Returns what
    it did: runs ``revised`` (accepted now), ``already`` (accepted before a crash), ``stale``
    (moved on since the shadow) and ``unchanged``."""
    lease, row = ledger.claim_shadow(shadow_id, worker_id, lease_seconds)
    try:
        state = str(row["state"])
        if state not in ("compared", "promoting"):
            raise InvalidInputError(
                "shadow", f"{shadow_id} is {state}: only a compared shadow can be promoted"
            )
        if state == "compared":
            unmet = steps.rule.unmet(row["summary"])
            if unmet is not None and not force:
                raise InvalidInputError(
                    "shadow",
                    f"{shadow_id} does not meet the job's rule ({steps.rule.describe()}): "
                    f"{unmet}; promote it with --force to promote it anyway",
                )
            ledger.shadow_to(
                lease, "promoting", ["compared"], revise=revise, channels=list(channels or [])
            )
            row = {**row, "revise": revise, "channels": list(channels or [])}
        done = {"revised": 0, "already": 0, "stale": 0, "failed": 0, "unchanged": 0}
        if row["revise"]:
            _revise_changed(ledger, admin, steps, lease, row, done)
        ledger.shadow_to(
            lease,
            "promoted",
            ["promoting"],
            summary={**row["summary"], **{f"promotion_{k}": v for k, v in done.items()}},
        )
    finally:
        try:
            ledger.release_shadow(lease)
        except Exception:  # noqa: BLE001 - the lease lapses by itself
            pass
    return {"shadow": progress(ledger, shadow_id), **done}


def _revise_changed(
    ledger: RunLedger,
    admin: LedgerAdmin,
    steps: ShadowSteps,
    lease: ShadowLease,
    row: dict[str, Any],
    done: dict[str, int],
) -> None:
    channels = list(row["channels"] or [])
    mark = f"shadow:{lease.shadow_id}"
    items = ledger.shadow_items(lease.shadow_id)
    for item in items:
        if item["verdict"] not in ("differ", "new") or item["answer"] is None:
            done["unchanged"] += 1
            continue
        if item["promoted_revision"] is not None:
            done["already"] += 1
            continue
        ledger.renew_shadow(lease)  # a promoter whose lease was taken over revises nothing
        record = ledger.get(item["run_id"])
        if record is None:
            done["stale"] += 1
            continue
        if item["verdict"] == "new":  # it never completed: its first answer, no revision
            _complete_new(ledger, steps, lease, item, row, record, done)
            continue
        revision = int(item["revision"]) + 1
        ours = record.revision == revision and _revised_by(admin, item["run_id"], revision, mark)
        if (
            record.revision == item["revision"]
            and record.status == "completed"
            and (record.input_fingerprint == item["input_fingerprint"])
        ):
            try:
                admin.revise(
                    item["run_id"],
                    f"shadow {lease.shadow_id} promoted version {row['version']}",
                    channels=channels,
                    requested_by=mark,
                    expected_revision=int(item["revision"]),
                )
            except InvalidInputError:  # revised or reopened since it was read: not this answer
                done["stale"] += 1
                continue
        elif not ours:
            done["stale"] += 1  # revised, recollected or recomputed since: not this answer
            continue
        elif record.status == "completed":  # accepted before a crash cut the promotion
            ledger.mark_item_promoted(lease, item["run_id"], revision)
            done["already"] += 1
            continue
        accepted = _accept(ledger, steps, lease, item, revision, row)
        _count(ledger, lease, item, revision, accepted, done)


def _complete_new(
    ledger: RunLedger,
    steps: ShadowSteps,
    lease: ShadowLease,
    item: dict[str, Any],
    row: dict[str, Any],
    record: Any,
    done: dict[str, int],
) -> None:
    """A run that never completed (a quarantined one) gets the shadow's answer as its first
    accepted result, on the revision and checkpoint the shadow computed on; delivered as a
    first result is (no revision key)."""
    revision = int(item["revision"])
    if record.status == "completed":
        if record.revision == revision and record.output == item["answer"]:
            ledger.mark_item_promoted(lease, item["run_id"], revision)  # before a crash
            done["already"] += 1
        else:
            done["stale"] += 1  # completed by another attempt since: that answer stands
        return
    if record.revision != revision or record.input_fingerprint != item["input_fingerprint"]:
        done["stale"] += 1
        return
    accepted = _accept(ledger, steps, lease, item, revision, row)
    _count(ledger, lease, item, revision, accepted, done)


def _count(
    ledger: RunLedger,
    lease: ShadowLease,
    item: dict[str, Any],
    revision: int,
    accepted: bool | None,
    done: dict[str, int],
) -> None:
    """Mark an item accepted now, or count why it was not."""
    if accepted:
        ledger.mark_item_promoted(lease, item["run_id"], revision)
        done["revised"] += 1
    else:
        done["stale" if accepted is False else "failed"] += 1


def _revised_by(admin: LedgerAdmin, run_id: str, revision: int, mark: str) -> bool:
    return any(r.revision == revision and r.requested_by == mark for r in admin.revisions(run_id))


def _accept(
    ledger: RunLedger,
    steps: ShadowSteps,
    lease: ShadowLease,
    item: dict[str, Any],
    revision: int,
    row: dict[str, Any],
) -> bool | None:
    """Accept the shadow's answer as the run's result under ``revision`` (its call, paid once,
    becomes the accepted one); ``False`` when the run moved on meanwhile, ``None`` when its
    commit failed (the run's attempt ended with the error; the promotion goes on)."""
    run_lease = ledger.claim(item["run_id"], f"{lease.call_worker}:promote", RUN_LEASE_SECONDS)
    if run_lease is None:
        return False  # completed meanwhile, or held by a worker: left as it is
    identity = RunIdentity(
        steps.job_name, item["subject_id"], item["scheduled_at"], str(row["baseline_version"])
    )
    usage = ModelUsage(None, item["input_tokens"], item["output_tokens"])
    answer = BoundAnswer(
        output=dict(item["answer"]),
        usage=usage,
        basis=Basis(revision=revision, input_fingerprint=item["input_fingerprint"]),
        config=steps.config,
        origin=CallOrigin(caller_step="shadow", caller_run_id=lease.call_worker, retry_number=0),
    )
    payloads = steps.notifications

    def messages(output: dict[str, Any]) -> Any:
        return payloads(identity, output) if payloads is not None else None

    try:
        done = commit(ledger, run_lease, answer, messages if payloads is not None else None)
    except (StaleCandidateError, LeaseLostError):
        return False
    except LedgerConnectionError:
        raise
    except Exception:  # noqa: BLE001 - this run's commit failed (its payload builder, say):
        return None  # commit ended its attempt (lease given back); the other runs go on
    return done.accepted


def gate_reason(shadows: Sequence[dict[str, Any]], rule: ShadowRule, version: str) -> str | None:
    """Why a version's schedule may not deliver yet (``None``: it may): no shadow of it was
    promoted, and none meets ``rule`` (``shadows``: the version's, from the ledger's
    ``shadow_gate``)."""
    if any(s["state"] == "promoted" for s in shadows):
        return None
    compared = [s for s in shadows if s["state"] in ("compared", "promoting")]
    for shadow in compared:
        if rule.unmet(shadow["summary"]) is None:
            return None
    if not shadows:
        return (
            f"version {version} is gated: no shadow of it yet (idempotent-jobs shadow start "
            f"--version {version}); it delivers once one meets the rule ({rule.describe()}) "
            "or is promoted"
        )
    latest = compared[0] if compared else shadows[0]
    why = rule.unmet(latest["summary"]) if compared else f"it is {latest['state']}"
    return (
        f"version {version} is gated: shadow {latest['shadow_id']} does not meet the rule "
        f"({rule.describe()}): {why}"
    )
