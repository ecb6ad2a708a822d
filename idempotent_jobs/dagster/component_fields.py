"""The typed fields of the ``IdempotentJob`` component's YAML (``defs.yaml``): a resource, the
window, a budget, the op retry, a rate limit; each bounded and explained, so ``dg check defs``
refuses a bad value naming its field."""

from typing import Any, Literal

import dagster as dg
from pydantic import Field, field_validator


class ResourceDecl(dg.Model):
    """One resource: its class (an import path; a bare name is one of this package's, such as
    ``WebhookChannel``) and its settings (``{env: NAME}``: read from the environment)."""

    type: str = Field(description="import path of the resource class, e.g. .steps.MyCollector")
    config: dict[str, Any] = Field(default_factory=dict, description="the resource's settings")


class WindowDecl(dg.Model):
    """The time dimension of the partitions: one partition per ``every`` from ``start``."""

    start: str = Field(description="the first window, e.g. 2026-11-01 (hours: 2026-11-01-00:00)")
    every: Literal["hour", "day", "week", "month"] = "day"
    timezone: str = Field(default="UTC", description="the windows' time zone (run ids are UTC)")


class BudgetDecl(dg.Model):
    """Tokens per UTC day the job's model calls may spend, decided in the ledger."""

    tokens_per_day: int | None = None
    tokens_per_subject_per_day: int | None = None


class BudgetItemDecl(dg.Model):
    """One budget in the ledger: tokens or money (the ledger's currency) per UTC day or month,
    for the job, for each of its subjects, or for a group of jobs."""

    amount: str = Field(description="the cap: a whole number of tokens, or an amount of money")
    unit: Literal["tokens", "money"] = "tokens"
    period: Literal["day", "month"] = "day"
    scope: Literal["job", "subject", "group"] = "job"
    group: str | None = Field(default=None, description="the group's name (scope: group)")


class RetryDecl(dg.Model):
    """How the model step is retried after a failure that may pass (a 429, a 5xx, a timeout);
    one that cannot (a 4xx, a redirect, a refusal before any request, a budget) never is."""

    max_retries: int = Field(default=3, description="retries of the model step, 0 to 20")
    delay_seconds: float = Field(default=2.0, description="the first retry's delay, 0 to 3600")
    backoff: Literal["exponential", "linear"] = Field(
        default="exponential", description="how the delay grows between retries"
    )
    jitter: bool = Field(default=True, description="spread retries by up to the delay")

    @field_validator("max_retries")
    @classmethod
    def _retries(cls, value: int) -> int:
        if not 0 <= value <= 20:
            raise ValueError(f"is {value}, not a whole number from 0 to 20")
        return value

    @field_validator("delay_seconds")
    @classmethod
    def _delay(cls, value: float) -> float:
        if not 0 <= value <= 3600:  # NaN and infinities too
            raise ValueError(f"is {value}, not a number of seconds from 0 to 3600")
        return value

    def policy(self) -> dg.RetryPolicy:
        return dg.RetryPolicy(
            max_retries=self.max_retries,
            delay=self.delay_seconds,
            backoff=dg.Backoff.EXPONENTIAL if self.backoff == "exponential" else dg.Backoff.LINEAR,
            jitter=dg.Jitter.PLUS_MINUS if self.jitter else None,
        )


class RateLimitDecl(dg.Model):
    """A provider's rate limit the job's model calls keep, with every worker on the ledger."""

    provider: str = Field(description="openai or anthropic")
    model: str = Field(description="the model asked for")
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    key_name: str = ""
    window_seconds: int = 60
