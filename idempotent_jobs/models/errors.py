"""What a provider call can end in, as typed errors a worker and an operator can act on.

Each is a :class:`~idempotent_jobs.core.errors.PaidCallError`: the attempt records the call with
the usage the provider reported (``answered`` when an answer came and was refused). The
``transient`` ones (a 429, a 5xx or an overloaded provider, a timeout, a dropped connection) are
retried inside the attempt, up to a bound, honouring the provider's ``Retry-After``; the others
end the attempt at once.
"""

from typing import ClassVar
from urllib.parse import urlsplit

from idempotent_jobs.core.errors import PaidCallError
from idempotent_jobs.core.records import ModelUsage


class ProviderError(PaidCallError):
    """A model provider's call failed."""

    transient: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        usage: ModelUsage | None = None,
        answered: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
        sent: bool = True,
    ) -> None:
        super().__init__(f"{provider}: {message}", usage=usage, answered=answered)
        self.provider = provider
        self.status = status
        #: Whether the request may have reached the provider: ``False`` when the connection
        #: could not even be made (nothing was sent, so nothing can have been billed).
        self.sent = sent
        #: Seconds the provider asked to wait before the next request (``Retry-After``).
        self.retry_after = retry_after

    @property
    def final(self) -> bool:
        """Whether another try cannot change the outcome (a 4xx other than 408, 409 and 429,
        a redirect, an answer still outside the schema after its repair turns): the step
        fails without its retry policy. A transient error (a 429, a 5xx, a timeout, a dropped
        connection) may pass, and so may an answer the model could give differently."""
        if self.transient or self.status in (408, 409, 429):
            return False
        return isinstance(self, (ProviderRequestError, OutputSchemaError))


def never_sent(exc: BaseException) -> bool:
    """Whether an SDK's connection error (or timeout) happened while connecting, before any
    byte of the request was sent: an ``httpx.ConnectError`` or ``httpx.ConnectTimeout`` in its
    causes (both SDKs are built on httpx)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        kind = type(cause)
        if kind.__module__.startswith("httpx") and kind.__name__ in (
            "ConnectError",
            "ConnectTimeout",
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


class RateLimitedError(ProviderError):
    """The provider refused the request for a rate limit (HTTP 429)."""

    transient = True


class ProviderUnavailableError(ProviderError):
    """The provider failed or was overloaded (HTTP 5xx, 529), or the connection dropped."""

    transient = True


class ProviderTimeoutError(ProviderError):
    """No answer within the timeout: the request may still have been processed (and billed)."""

    transient = True


class ContextTooLongError(ProviderError):
    """The prompt does not fit the model's context window: shorten the input or the prompt."""


class RefusalError(ProviderError):
    """The model refused to answer (a refusal, not an answer outside the schema)."""


class ContentFilteredError(ProviderError):
    """The provider's content filter stopped the answer."""


class OutputSchemaError(ProviderError):
    """The answer stayed outside the output schema after the repair turns it was given."""


class ProviderRequestError(ProviderError):
    """The provider refused the request itself (HTTP 4xx other than 429: a bad key, a model
    it does not have, a schema it does not accept)."""


class RedirectRefusedError(ProviderRequestError):
    """The provider's URL answered with a redirect (3xx). A model call never follows one: the
    prompt (and the key) would go to another host, and its answer would be taken as the
    model's. Point ``base_url`` at the final address."""


def redirect_error(provider: str, status: int, location: str | None) -> RedirectRefusedError:
    """The error of a model call answered with a redirect, naming the host it pointed at."""
    host = urlsplit(location or "").netloc or location or "an unnamed place"
    return RedirectRefusedError(
        f"answered {status}, a redirect to {host}: a model call follows no redirect; set "
        "base_url to the final address",
        provider=provider,
        status=status,
    )


__all__ = [
    "ContentFilteredError",
    "ContextTooLongError",
    "OutputSchemaError",
    "ProviderError",
    "ProviderRequestError",
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "RateLimitedError",
    "RedirectRefusedError",
    "RefusalError",
]
