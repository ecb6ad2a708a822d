"""The specification of one scheduled AI job: identity, partitions, steps, channels, leases.

Any AI job fits: the spec names the resource keys of its :class:`Collector` and
:class:`ModelStep`, and takes its validator and payload builder as functions.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import dagster as dg

from idempotent_jobs.core.budgets import BudgetSpec
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import RunIdentity, clean_identity_text
from idempotent_jobs.core.policy import CallPolicy
from idempotent_jobs.core.rate_limits import RateLimit
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.core.retention import RetentionPolicy
from idempotent_jobs.dagster.partitions import identity_for_partition, window_by_subject
from idempotent_jobs.dagster.resources.steps import ModelStep
from idempotent_jobs.shadows.job import ShadowRule

JSONDict = dict[str, Any]


def callable_name(function: Callable[..., object]) -> str:
    """``module.qualname`` of a function (of its class for other callables): stable across
    processes and deploys as long as the code keeps the name."""
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', repr(named))}"


def default_payload(identity: RunIdentity, output: JSONDict) -> JSONDict:
    """The notification sent for an accepted result, on every channel: its ``summary`` (or, for
    a model step with no output schema, its ``text``)."""
    return {
        "job": identity.job_name,
        "subject": identity.subject_id,
        "window_start": identity.scheduled_at.isoformat(),
        "summary": output.get("summary", output.get("text")),
    }


def default_validate(output: JSONDict) -> bool:
    """Accept an output with a non-empty text ``summary``, or the non-empty ``text`` a model
    step with no output schema answers (``{"text": ...}``): the defaults fit each other."""
    summary = output.get("summary", output.get("text") if set(output) == {"text"} else None)
    return isinstance(summary, str) and bool(summary.strip())


def _identity_text(field_name: str, value: object) -> str:
    text = clean_identity_text(field_name, value)
    assert isinstance(value, str)
    if value != value.strip():
        raise InvalidInputError(
            field_name, f"has spaces around it, which a run would strip (to {text!r})"
        )
    return text


#: A Dagster name (``dagster._core.definitions.utils.VALID_NAME_REGEX``, private there).
_DAGSTER_NAME = re.compile(r"[A-Za-z0-9_]+")

#: What Dagster refuses in a multi-partition key's dimension (``|`` is refused by every run's
#: identity rules already): a subject holding one would fail the job's definition, unnamed.
_NOT_IN_A_PARTITION_KEY = frozenset(",[]")

#: How many partitions' identities a spec keeps (a code server may live for months).
_IDENTITIES_KEPT = 100_000


@dataclass(frozen=True)
class IdempotentJobSpec:
    """What makes one scheduled AI job: its identity, its partitions and its steps.

    ``identity_job_name`` and ``version`` go into every run id: change ``version`` on purpose
    to recompute everything, never implicitly. ``collector`` and ``model`` are resource keys of a
    :class:`Collector` and a :class:`ModelStep`; ``prompt`` is the job's instructions, handed to
    the model step in its :class:`StepContext`. ``validate`` accepts or rejects an answer (an
    exception or ``False`` rejects it); ``payload`` builds the notification of an accepted one.
    ``channels`` are resource keys of ``NotificationChannel`` resources. ``retention`` says how
    long payloads are kept (by default forever); the run rows themselves are never pruned.
    ``budget`` declares the job's budgets (:class:`Budget`: tokens or money per UTC day or
    month, for the job, each subject or a group of jobs; or a :class:`TokenBudget`), held
    against the ledger's when a worker first calls the model: the ledger's is enforced by every
    worker, and a spec that differs fails its step naming both, unless ``follow_ledger_budget``.
    A refused step fails without retry. ``max_tokens_per_call``: the most one call of the
    model step takes, reserved before it runs (the provider models reserve each request's own
    worst case).
    ``rate_limits`` are the provider limits its model steps keep (:class:`RateLimit`: requests
    and tokens per minute per provider and model), declared in the ledger when a worker first
    calls the model and kept by every worker of every deployment sharing it.
    ``model_retry`` is the model step's op retry policy (3 retries, 2 s, exponential backoff
    with jitter), for a failure that may pass: a 429, a 5xx, a timeout, a dropped connection,
    an answer the validator refused. A failure another try cannot change (a provider 4xx
    other than 408/409/429, a redirect, an answer outside the schema after its repair turns, a
    refusal before any request, a budget) fails the step at once, whatever the policy.
    ``compare`` scores a shadow's answer against the accepted one (``compare(accepted, new)``:
    a bool, a score from 0 to 1, ``"agree"``/``"differ"``; default: field by field), and
    ``shadow_rule`` (:class:`ShadowRule`) is what a shadow of a new version must show before it
    is promoted without ``--force``. ``gated``: this version's schedule delivers nothing (its
    ticks are skipped, with the reason in the UI) until a shadow of it meets ``shadow_rule`` or
    is promoted (``idempotent-jobs shadow``).
    """

    name: str
    identity_job_name: str
    version: str
    window: dg.TimeWindowPartitionsDefinition
    subjects: Sequence[str]
    prompt: str = ""
    collector: str = "collector"
    model: str = "model"
    channels: Sequence[str] = ("report_file",)
    validate: Callable[[JSONDict], object] = default_validate
    payload: Callable[[RunIdentity, JSONDict], JSONDict] = default_payload
    lease_seconds: float = 300.0
    wait_seconds: float | None = None
    model_retry: dg.RetryPolicy = field(
        default_factory=lambda: dg.RetryPolicy(
            max_retries=3, delay=2.0, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
        )
    )
    description: str = ""
    retention: RetentionPolicy = RetentionPolicy()
    budget: BudgetSpec | None = None
    follow_ledger_budget: bool = False
    max_tokens_per_call: int | None = None
    rate_limits: Sequence[RateLimit] = ()
    compare: Callable[[JSONDict, JSONDict], object] | None = None
    shadow_rule: ShadowRule = ShadowRule()
    gated: bool = False

    def __post_init__(self) -> None:
        """The identity fields are checked when the job is built, by the rules a run applies
        (:func:`clean_identity_text`), so a subject no run could take is refused here, naming
        it, instead of failing every run of it. A subject or name with surrounding spaces
        would be stripped into another one: refused too. The name must be a Dagster name: it
        names the job, its schedule and its ops."""
        if not isinstance(self.name, str) or not _DAGSTER_NAME.fullmatch(self.name):
            raise InvalidInputError(
                f"IdempotentJobSpec {self.name!r}: name",
                "must be letters, digits and underscores only, as Dagster names a job and its "
                "ops (the ledger's name, identity_job_name, may hold other characters)",
            )
        for field_name, value in (
            ("identity_job_name", self.identity_job_name),
            ("version", self.version),
        ):
            _identity_text(f"IdempotentJobSpec {self.name!r}: {field_name}", value)
        if isinstance(self.subjects, str):
            raise InvalidInputError(
                f"IdempotentJobSpec {self.name!r}: subjects", "must be a list, not one string"
            )
        seen: dict[str, str] = {}
        for subject in self.subjects:
            named = f"IdempotentJobSpec {self.name!r}: subject {subject!r}"
            text = _identity_text(named, subject)
            if set(text) & _NOT_IN_A_PARTITION_KEY:
                raise InvalidInputError(
                    named,
                    "must not contain ',', '[' or ']' (Dagster's multi-partition keys, "
                    "window x subject, cannot hold them)",
                )
            if text in seen:
                raise InvalidInputError(
                    f"IdempotentJobSpec {self.name!r}: subjects",
                    f"{seen[text]!r} and {subject!r} are the same subject once normalised",
                )
            seen[text] = subject
        try:
            self.call_policy  # noqa: B018 (checked, and built once, here)
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"IdempotentJobSpec {self.name!r}: {exc.field}", exc.reason
            ) from None

    @cached_property
    def call_policy(self) -> CallPolicy:
        """What decides whether the job's model call may be sent (its drills, budgets, most
        tokens per call and rate limits), built once."""
        return CallPolicy(
            job_name=self.identity_job_name,
            budget=self.budget,
            follow_ledger_budget=self.follow_ledger_budget,
            max_tokens_per_call=self.max_tokens_per_call,
            rate_limits=self.rate_limits,
        )

    @cached_property
    def partitions_def(self) -> dg.MultiPartitionsDefinition:
        """The job's partitions (window x subject), made once."""
        return window_by_subject(self.window, self.subjects)

    @property
    def holder_wait_seconds(self) -> float:
        """How long a step waits for another worker's lease before failing (default 2 leases)."""
        return self.wait_seconds if self.wait_seconds is not None else 2 * self.lease_seconds

    def identity_for(self, partition_key: str) -> RunIdentity:
        """The run identity of a partition: computed once per partition and process (each op
        of a run, its telemetry and its failure hook ask for it; a backfill's ops ask for
        thousands), then read from this spec's own table."""
        known = self._identities.get(partition_key)
        if known is None:
            known = identity_for_partition(
                self.partitions_def, partition_key, self.identity_job_name, self.version
            )
            if len(self._identities) >= _IDENTITIES_KEPT:
                self._identities.clear()  # a bounded table: a long-lived code server forgets
            self._identities[partition_key] = known
        return known

    @cached_property
    def _identities(self) -> dict[str, RunIdentity]:
        return {}

    def notifications(self, identity: RunIdentity, output: JSONDict) -> Mapping[str, JSONDict]:
        payload = self.payload(identity, output)
        return {channel: payload for channel in self.channels}

    def config(self, model_name: str, settings: Mapping[str, str] | None = None) -> JobConfig:
        """What an answer of this job is computed under besides its identity: recorded with
        each accepted result, compared when a completed run is reused."""
        return JobConfig.of(
            prompt=self.prompt,
            model=model_name,
            validator=callable_name(self.validate),
            **dict(settings or {}),
        )

    def config_of(self, model: ModelStep) -> JobConfig:
        """:meth:`config` under the model step ``model`` (its name and settings)."""
        return self.config(model.model_name, model.settings())

    def tags(self) -> dict[str, str]:
        return {
            "idempotent_jobs/job": self.identity_job_name,
            "idempotent_jobs/version": self.version,
        }
