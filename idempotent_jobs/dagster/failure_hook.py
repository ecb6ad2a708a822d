"""End a Dagster run's attempt when one of its steps fails outside its own body.

A step's body ends its attempt on every failure (``core/steps.py``). But a step can fail before
its body runs or after it returned: its input cannot be loaded, or its output cannot be stored,
by an IO manager (an object store under the multiprocess or Kubernetes executor). The lease
would then stay held until it expires, with no error kept. This failure hook, on every idempotent
job, ends such an attempt at once: fenced by the Dagster run that claimed the lease, so a run
another worker has taken since is never touched, and a paid answer already recorded
(``answered``) stays for the next attempt to commit instead of paying again.
"""

import dagster as dg

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec

PARTITION_TAG = "dagster/partition"


def build_failure_hook(spec: IdempotentJobSpec) -> dg.HookDefinition:
    @dg.failure_hook(name=f"{spec.name}_end_attempt", required_resource_keys={"ledger"})
    def end_attempt_on_step_failure(context: dg.HookContext) -> None:
        """End this Dagster run's attempt on the ledger run, if a step failure left it held."""
        run = context.instance.get_run_by_id(context.run_id)
        partition_key = run.tags.get(PARTITION_TAG) if run is not None else None
        if not partition_key:
            return
        try:
            identity = spec.identity_for(partition_key)
        except LedgerError:
            return
        failure = context.op_exception
        reason = describe_error(failure) if failure is not None else "the step failed"
        ledger: RunLedger = context.resources.ledger
        try:
            ended = ledger.end_caller_attempt(
                identity.run_id, context.run_id, f"step {context.step_key} failed: {reason}"
            )
        except Exception as exc:  # the lease then expires as before; say why
            context.log.warning(f"ledger run {identity.run_id}: attempt not ended: {exc}")
            return
        if ended == "applied":
            context.log.info(
                f"ledger run {identity.run_id}: attempt ended after step {context.step_key} "
                "failed outside its body (the lease is free)"
            )

    return end_attempt_on_step_failure
