"""The step outputs store: what a Dagster step hands the next, kept in the ledger (the ledger IO
manager's storage, ``sql/step_outputs.sql``); retention prunes it with its run's attempts."""

from datetime import datetime
from typing import Any

from idempotent_jobs.core.checks import check_name
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.json_values import dump_json_object
from idempotent_jobs.core.stores.base import Store


class StepOutputsStore(Store):
    """Step outputs."""

    def store_step_output(
        self, dagster_run_id: str, step_key: str, output_name: str, value: dict[str, Any]
    ) -> None:
        """Keep ``value`` (JSON) as what a Dagster step hands the next (the ledger IO manager);
        ``value["run_id"]``, when it names a registered run, ties it to that run."""
        params = {
            "dagster_run_id": check_name("dagster_run_id", dagster_run_id),
            "step_key": check_name("step_key", step_key),
            "output_name": check_name("output_name", output_name),
            "run_id": value.get("run_id") if isinstance(value.get("run_id"), str) else None,
            "value": dump_json_object(value, "step output"),
        }
        self._db.rows("store_step_output", params)

    def load_step_output(
        self, dagster_run_id: str, step_key: str, output_name: str
    ) -> dict[str, Any] | None:
        """What :meth:`store_step_output` kept for that Dagster run, step and output."""
        params = {
            "dagster_run_id": dagster_run_id,
            "step_key": step_key,
            "output_name": output_name,
        }
        rows = self._db.rows("load_step_output", params)
        return dict(rows[0][0]) if rows else None

    def prune_step_outputs(
        self, job_name: str, before: datetime, batch_size: int | None, apply: bool
    ) -> tuple[int, int]:
        """One batch of what the ledger IO manager kept between the steps of the job's runs
        completed before ``before`` (``batch_size`` None: count them all): rows and bytes."""
        params = {
            "job_name": normalize_text(job_name),
            "before": before,
            "batch_size": batch_size,
            "apply": apply,
        }
        [(rows, size)] = self._db.rows("prune_step_outputs", params)
        return int(rows), int(size)
