"""What the ``shadow`` commands drive a shadow with: the new version's steps built from the code
location (a spec at that version, or the job's spec with a model or prompt changed), its batch
provider, and both ledger faces."""

import argparse
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import code_location, open_admin, open_worker


def worker_id() -> str:
    return f"cli:{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Overrides:
    """What a shadow changes of the job's spec when no spec defines its version: the model
    step's model and the prompt (``None``: the spec's)."""

    model: str | None = None
    prompt: str | None = None

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> "Overrides":
        parts = dict(row.get("config_parts") or {})
        return cls(model=parts.get("model"), prompt=parts.get("prompt"))


@contextmanager
def engine(
    args: argparse.Namespace,
    job: str,
    version: str,
    lane: str,
    overrides: Overrides = Overrides(),
    *,
    explicit: bool = False,
) -> Iterator[Any]:
    """The new version's steps, its batch provider (the batch lane's) and both ledger faces.

    The version is a spec of the code location (same identity job, that version), or, when
    none defines it, the job's spec at that version with ``overrides`` (its model step's model,
    its prompt): a new model or prompt tried with no code change. ``explicit``: the overrides
    were given on the command line (refused beside a spec that defines the version)."""
    from idempotent_jobs.dagster.resources.real_models import StructuredModel
    from idempotent_jobs.dagster.shadow_lane import shadow_steps

    workspace = code_location(args)
    try:
        spec = located = workspace.spec_at_version(job, version)
        derived = False
    except InvalidInputError:
        located = workspace.find_job(job).spec
        spec = replace(located, version=version, prompt=overrides.prompt or located.prompt)
        derived = True
    if explicit and not derived and (overrides.model or overrides.prompt):
        raise InvalidInputError(
            "--model",
            f"job {spec.name} defines version {version}: its spec says its prompt and model "
            "(--model and --prompt change a version no spec defines)",
        )
    with (
        workspace.model_step(located) as built,
        open_admin(args) as admin,
        open_worker(args) as ledger,
    ):
        model = built
        if derived and overrides.model and overrides.model != built.model_name:
            if not isinstance(built, StructuredModel):
                raise InvalidInputError(
                    "--model", f"{type(built).__name__} takes no model name to change"
                )
            model = built.model_copy(update={"model": overrides.model})
        provider = None
        if lane == "batch":
            if not isinstance(model, StructuredModel):
                raise InvalidInputError(
                    "--lane",
                    f"job {spec.name}'s model step {type(model).__name__} has no batch API: "
                    "use --lane online",
                )
            provider = model.batch_provider()
        yield spec, shadow_steps(spec, model), provider, admin, ledger


def run_on(args: argparse.Namespace, ledger: Any, steps: Any, provider: Any, shadow_id: str) -> Any:
    """Advance the shadow one step, or with ``--wait`` until it is compared."""
    from idempotent_jobs.shadows import advance

    while True:
        found = advance(ledger, steps, provider, shadow_id, worker_id=worker_id())
        if found.compared or found.state == "dropped" or not args.wait:
            return found
        if found.state == "submitted":
            time.sleep(args.poll_seconds)
