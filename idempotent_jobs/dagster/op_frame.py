"""What one execution of an idempotent job's op works with, built once as it starts."""

import uuid
from dataclasses import dataclass
from functools import cached_property

import dagster as dg

from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.policy import CallPolicy
from idempotent_jobs.core.records import CallOrigin, JobConfig
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resources import ModelStep


@dataclass(frozen=True)
class OpFrame:
    """An op execution's context, its job's spec and the ledger, and what follows from them,
    each worked out once, when first asked (an op that never asks, as ``persist`` never asks for
    the model, never needs its resource): the run identity of the partition, the model step and
    the configuration it runs under, the job's call policy, the origin recorded with claims and
    calls, and the worker id the op's claims are made under."""

    context: dg.OpExecutionContext
    spec: IdempotentJobSpec
    ledger: RunLedger

    @classmethod
    def of(
        cls,
        context: dg.OpExecutionContext,
        spec: IdempotentJobSpec,
        ledger: RunLedger | None = None,
    ) -> "OpFrame":
        """The frame of ``context``'s op; ``ledger``: the op's ledger resource when it is
        passed as a parameter, else read from the context's resources."""
        return cls(context, spec, ledger if ledger is not None else context.resources.ledger)

    @cached_property
    def identity(self) -> RunIdentity:
        """The partition's run identity (raises for a key that names no run)."""
        return self.spec.identity_for(self.context.partition_key)

    @cached_property
    def model(self) -> ModelStep:
        """The job's model step (its resource)."""
        model: ModelStep = getattr(self.context.resources, self.spec.model)
        return model

    @cached_property
    def config(self) -> JobConfig:
        """The configuration the model step runs under (its name and settings)."""
        return self.spec.config_of(self.model)

    @property
    def policy(self) -> CallPolicy:
        """What decides whether the job's model call may be sent (built once by the spec)."""
        return self.spec.call_policy

    @cached_property
    def origin(self) -> CallOrigin:
        """The Dagster run and op making a claim or a model call, and the op's retry."""
        return CallOrigin(
            caller_step=self.context.op.name,
            caller_run_id=self.context.run_id,
            retry_number=self.context.retry_number,
        )

    @cached_property
    def worker_id(self) -> str:
        """Unique per op execution, readable in the ledger: Dagster run, op, retry, random."""
        context = self.context
        suffix = uuid.uuid4().hex[:6]
        return f"dagster:{context.run_id}:{context.op.name}:{context.retry_number}:{suffix}"
