"""``dg scaffold defs idempotent_jobs.dagster.IdempotentJob <name>``: a ``defs.yaml`` and, beside
it, a ``steps.py`` with a collector, a model step, a validator and a payload to fill in."""

from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from idempotent_jobs.core.constants import DATABASE_URL_ENV

STEPS_TEMPLATE = '''\
"""The code of the {name} job: the collector, the model step, the validator and the payload
builder its defs.yaml names. Replace the bodies with your own."""

from typing import Any

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity
from idempotent_jobs.dagster import Collector, ModelStep, StepContext


class Source(Collector):
    """Gathers one partition's input (called once per logical run: it is checkpointed)."""

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {{"subject": identity.subject_id, "day": str(identity.scheduled_at.date())}}


class Model(ModelStep):
    """The model call: call your provider here, or use OpenAICompatibleModel or AnthropicModel
    in defs.yaml (model, api_key, prompt, output_schema)."""

    @property
    def model_name(self) -> str:
        return "template-model"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        summary = f"{{context.instructions}} {{raw_input['subject']}} {{raw_input['day']}}"
        return ModelAnswer({{"summary": summary}}, ModelUsage(self.model_name, 10, 5))


def valid(output: dict[str, Any]) -> bool:
    """False (or an exception) refuses the answer; the attempt is retried."""
    return bool(output.get("summary"))


def payload(identity: RunIdentity, output: dict[str, Any]) -> dict[str, Any]:
    """What each channel receives for an accepted answer."""
    return {{"subject": identity.subject_id, "window_start": identity.scheduled_at.isoformat(),
            **output}}
'''


class IdempotentJobScaffolder(dg.Scaffolder):
    """Writes ``defs.yaml`` (every field, with the defaults spelled out) and ``steps.py``."""

    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        folder = Path(request.target_path)
        folder.mkdir(parents=True, exist_ok=True)
        name = folder.name
        attributes = {
            "name": name,
            "identity_job_name": name.replace("_", "-"),
            "version": "v1",
            "window": {"start": "2026-11-01", "every": "day"},
            "subjects": ["first-subject", "second-subject"],
            "prompt": f"Summarise {name} for",
            "collector": {"type": ".steps.Source"},
            "model_step": {"type": ".steps.Model"},
            "validator": ".steps.valid",
            "payload": ".steps.payload",
            "channels": {f"{name}_file": {"type": "JsonLinesChannel"}},
            "ledger": {"database_url": {"env": DATABASE_URL_ENV}},
        }
        document = {"type": request.type_name, "attributes": attributes}
        (folder / "defs.yaml").write_text(
            yaml.safe_dump(document, sort_keys=False), encoding="utf-8"
        )
        steps = folder / "steps.py"
        if not steps.exists():
            steps.write_text(STEPS_TEMPLATE.format(name=name), encoding="utf-8")
