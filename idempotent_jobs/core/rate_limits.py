"""Provider rate limits, decided in the ledger for every worker of every deployment.

A :class:`RateLimit` caps the requests and the tokens a provider takes for one model (and API
key name) per window, a minute unless said. It is declared by a job's spec (written when its
workers start; an operator's ``idempotent-jobs limits set`` stands over it) or by an operator.
Before each request to a limited model a worker reserves its place in the ledger, on the
database clock (``acquire_rate`` in ``sql/limits.sql``, one statement), and waits until then
instead of meeting a 429. It paces at :data:`PACE_SHARE` of the limit, with bursts of
:data:`BURST_SHARE` of a window: the provider's own bucket keeps the difference against the
jitter between a reservation and the request's arrival. The tokens a request takes are
estimated before it is sent, as providers count them: its prompt's length (a token per 3
characters, generous) plus the most it may answer (``max_tokens``).

Fairness: a subject whose earlier reservation is still pending may reserve at most half a
window ahead, and asks again past that, while a subject with none may reserve a whole window
ahead: a backfill of one subject does not push another subject's run more than a window out.
"""

from dataclasses import dataclass
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError

#: How long a worker's copy of the ledger's limits is trusted before it is read again.
LIMITS_TTL_SECONDS = 30.0
#: The shortest wait between two asks of a subject told to ask again.
MIN_POLL_SECONDS = 0.02
#: How much of a window's worth the ledger lets go at once. The provider's bucket keeps the rest
#: against the jitter between a reservation and the request's arrival: a new process's first
#: request (the SDK's first call) arrives up to half a second after its place.
BURST_SHARE = 0.6
#: The rate the ledger paces at, as a share of the limit: the provider's bucket slowly refills
#: under it, so a late request followed by a punctual one never finds it empty.
PACE_SHARE = 0.95


@dataclass(frozen=True)
class RateLimit:
    """At most ``requests_per_minute`` requests and ``tokens_per_minute`` tokens per
    ``window_seconds`` (60: a minute) to ``model`` of ``provider`` (``openai``,
    ``anthropic``), for the API key named ``key_name`` (a label, never the key; empty: any)."""

    provider: str
    model: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    key_name: str = ""
    window_seconds: int = 60

    def __post_init__(self) -> None:
        for name in ("provider", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip() or len(value) > 200:
                raise InvalidInputError(
                    name, f"must be a name of 1 to 200 characters, got {value!r}"
                )
        if not isinstance(self.key_name, str) or len(self.key_name) > 200:
            raise InvalidInputError("key_name", f"must be a name, got {self.key_name!r}")
        for name, top in (("requests_per_minute", 2**31 - 1), ("tokens_per_minute", 2**62)):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top
            ):
                raise InvalidInputError(name, f"must be a whole number from 1, got {value!r}")
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise InvalidInputError(
                "requests_per_minute", "a rate limit needs requests or tokens per minute"
            )
        seconds = self.window_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 86400:
            raise InvalidInputError("window_seconds", f"must be 1 to 86400, got {seconds!r}")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.provider, self.model, self.key_name)

    def params(self) -> dict[str, Any]:
        """The limit as the statements that write it take it (both faces write one)."""
        return {
            "provider": self.provider,
            "model": self.model,
            "key_name": self.key_name,
            "requests": self.requests_per_minute,
            "tokens": self.tokens_per_minute,
            "window_seconds": self.window_seconds,
        }


@dataclass(frozen=True)
class RateRequest:
    """One request about to be sent: whose limit it falls under and the tokens it may take.

    ``tokens`` is the estimate a rate limit reserves (as providers count them); the budget's
    worst case is ``max_input_tokens`` (an upper bound: a token is at least a byte of the
    request) and ``max_output_tokens`` (the request's ``max_tokens``), ``None`` where unknown.
    """

    provider: str
    model: str
    tokens: int = 0
    key_name: str = ""
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.provider, self.model, self.key_name)


@dataclass(frozen=True)
class RateGrant:
    """The ledger's answer: ``granted`` (go after ``wait_seconds``), else ask again then."""

    granted: bool
    wait_seconds: float


def applies(limit: RateLimit, request: RateRequest) -> int:
    """The tokens ``request`` reserves under ``limit``: never more than the burst's share of
    the window's tokens, the most one reservation can take (a bigger one is paced as that)."""
    if limit.tokens_per_minute is None:
        return 0
    return min(max(0, request.tokens), int(limit.tokens_per_minute * BURST_SHARE * PACE_SHARE))


__all__ = ["RateGrant", "RateLimit", "RateRequest"]
