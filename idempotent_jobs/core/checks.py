"""What the ledger checks before it writes, and how a call's values become statement parameters.

Every check raises :class:`~idempotent_jobs.core.errors.InvalidInputError` naming the field and the
reason, before anything is written; both faces of the ledger use them, so a name, a channel or a
limit means the same to a worker and to an operator.
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from idempotent_jobs.core.errors import (
    IdentityConflictError,
    InvalidInputError,
    StaleCandidateError,
)
from idempotent_jobs.core.identity import RunIdentity, normalize_text
from idempotent_jobs.core.json_values import dump_json_object, text_fingerprint
from idempotent_jobs.core.records import Basis, CallOrigin, Lease, ModelUsage, RunRecord
from idempotent_jobs.core.usage import recordable_usage


@dataclass(frozen=True)
class JsonPayload:
    """A JSON object checked and serialised once, on its way to a statement: the value, its
    canonical JSON text, that text's size in bytes, and (when asked) its fingerprint. An answer
    is made one when it is checked, and the same text is recorded and committed."""

    value: dict[str, Any]
    text: str
    size: int

    @classmethod
    def of(cls, value: object, field: str, limit: int) -> "JsonPayload":
        """``value`` as a payload if it is a storable JSON object within ``limit`` bytes, else
        :class:`InvalidInputError` naming ``field`` (nothing is written)."""
        text = dump_json_object(value, field)
        size = len(text.encode("utf-8"))
        if size > limit:
            raise InvalidInputError(
                field,
                f"is {size:,} bytes as JSON, over the limit of {limit:,} (max_{field}_bytes)",
            )
        assert isinstance(value, dict)
        return cls(value, text, size)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 (hex) of the text: equal values, equal fingerprints."""
        return text_fingerprint(self.text)


MAX_LEASE_SECONDS = 24 * 3600.0
MAX_NAME_CHARS = 200
MAX_CHANNEL_CHARS = 100
MAX_REASON_CHARS = 2000
_NO_USAGE = ModelUsage()


def check_name(field: str, value: object, limit: int = MAX_NAME_CHARS) -> str:
    """A short free-text column (worker id, caller run id, step, model, requested_by)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, "must be a non-empty string")
    if len(value) > limit:
        raise InvalidInputError(field, f"must be at most {limit} characters, got {len(value)}")
    if not value.isprintable():
        raise InvalidInputError(field, "must not contain control or other unprintable characters")
    return value


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError("limit", f"must be a whole number, got {limit!r}")
    if limit < 1:
        raise InvalidInputError("limit", f"must be at least 1, got {limit}")
    return limit


def optional_name(field: str, value: str | None) -> str | None:
    return None if value is None else check_name(field, value)


def check_worker_id(worker_id: str) -> str:
    return check_name("worker_id", worker_id)


def check_lease_seconds(lease_seconds: float) -> float:
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
        raise InvalidInputError("lease_seconds", "must be a number of seconds")
    if not 0 < lease_seconds <= MAX_LEASE_SECONDS:
        raise InvalidInputError("lease_seconds", f"must be > 0 and <= {MAX_LEASE_SECONDS:.0f}")
    return float(lease_seconds)


def check_channel(field: str, channel: object) -> None:
    """A channel name is part of the idempotency key ``<run_id>:<channel>[:r<revision>]``, so a
    ``:`` in it could produce another channel's key (``ops:r1`` at revision 0 is ``ops`` at 1)."""
    if not isinstance(channel, str) or not channel.strip() or not channel.isprintable():
        raise InvalidInputError(field, f"channel name {channel!r} is not valid")
    if ":" in channel:
        raise InvalidInputError(
            field, f"channel name {channel!r} must not contain ':' (it separates the key's parts)"
        )
    if len(channel) > MAX_CHANNEL_CHARS:
        raise InvalidInputError(
            field, f"channel name {channel[:20]!r}... is longer than {MAX_CHANNEL_CHARS}"
        )


def notifications_json(notifications: Mapping[str, Any] | None) -> str:
    notifications = dict(notifications or {})
    for channel, payload in notifications.items():
        check_channel("notifications", channel)
        dump_json_object(payload, f"notifications[{channel!r}]")
    return dump_json_object(notifications, "notifications")


def identity_params(identity: RunIdentity) -> dict[str, Any]:
    return {
        "run_id": identity.run_id,
        "job_name": identity.job_name,
        "subject_id": identity.subject_id,
        "scheduled_at": identity.scheduled_at,
        "version": identity.version,
    }


def check_identity(record: RunRecord, identity: RunIdentity) -> None:
    stored = (record.job_name, record.subject_id, record.scheduled_at, record.version)
    wanted = (identity.job_name, identity.subject_id, identity.scheduled_at, identity.version)
    if stored != wanted:
        raise IdentityConflictError(
            f"run {identity.run_id} is stored with different identity fields"
        )


def stale_error(run_id: str, candidate: Basis, current: Basis) -> StaleCandidateError:
    def show(basis: Basis) -> str:
        checkpoint = (basis.input_fingerprint or "none")[:12]
        return f"revision {basis.revision}, checkpoint {checkpoint}"

    return StaleCandidateError(
        f"run {run_id}: the answer was computed on {show(candidate)}, the run is now on "
        f"{show(current)}; it was not accepted and nothing was sent",
        run_id=run_id,
        candidate=candidate,
        current=current,
    )


def caller_params(origin: CallOrigin | None) -> dict[str, Any]:
    """The caller's run and step that a claim records on the run (and its attempt)."""
    origin = origin or CallOrigin()
    return {
        "caller_run_id": optional_name("caller_run_id", origin.caller_run_id),
        "caller_step": optional_name("caller_step", origin.caller_step),
    }


def origin_params(origin: CallOrigin | None) -> dict[str, Any]:
    """Where a call was made, under short names (from when the statements that record a call
    had to fit psycopg's query cache; the executor numbers placeholders itself now)."""
    origin = origin or CallOrigin()
    return {
        "c_step": optional_name("caller_step", origin.caller_step),
        "c_run": optional_name("caller_run_id", origin.caller_run_id),
        "c_retry": origin.retry_number,
    }


def fence_params(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch}


def model_name(name: str | None) -> str | None:
    """The model name a provider reported, kept to 200 printable characters: it arrives with an
    answer already paid for, so it is trimmed rather than refused."""
    if name is None:
        return None
    text = "".join(ch if ch.isprintable() else "?" for ch in str(name))
    return text[:MAX_NAME_CHARS]


def check_job_names(names: Collection[str] | None) -> list[str] | None:
    """Identity job names as the ledger stores them (NFC), for a ``job_names`` filter."""
    if names is None:
        return None
    if isinstance(names, str):
        raise InvalidInputError("job_names", "must be a collection of job names, not one string")
    return sorted({normalize_text(name) for name in names})


def usage_params(usage: ModelUsage | None) -> dict[str, Any]:
    """The columns of a call's usage: only believable counts (a bad one is stored as NULL, so
    recording a paid call never fails on it; see :mod:`idempotent_jobs.core.usage`)."""
    usage = recordable_usage(usage) or _NO_USAGE
    return {
        "model_name": model_name(usage.model_name),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "u_rm": model_name(usage.requested_model),
        # The usage's parts, under short names (see origin_params).
        "u_cr": usage.cache_read_tokens,
        "u_cw": usage.cache_write_tokens,
        "u_cw1h": usage.cache_write_1h_tokens,
        "u_rt": usage.reasoning_tokens,
        "u_pn": model_name(usage.provider_name),
        "u_tier": model_name(usage.tier),
    }
