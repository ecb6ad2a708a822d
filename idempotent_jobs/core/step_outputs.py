"""What a Dagster step hands the next, kept in the ledger (the ledger IO manager's storage): part
of :class:`~idempotent_jobs.core.ledger.RunLedger` (a mixin of its worker face). Retention prunes
these rows with their run's attempts."""

from typing import Any

from idempotent_jobs.core.checks import check_name
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.core.json_values import dump_json_object


class StepOutputs(LedgerFace):
    """:meth:`store_step_output` and :meth:`load_step_output`, for the worker face."""

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
