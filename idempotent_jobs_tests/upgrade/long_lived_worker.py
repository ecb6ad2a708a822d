"""A long-lived worker of one release (run by that release's own Python, outside the
repository): one ledger opened once, kept across a ``migrate``, running one logical run per
subject read from stdin with ``run_idempotent`` and printing what happened as one JSON line.

Its statements are prepared before the migrate; a column the migrate adds invalidates them, and
the worker must go on. The model is the same fake provider the fleet's job calls."""

import json
import os
import sys
import urllib.request
from datetime import UTC, datetime
from typing import Any

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity, RunLedger, run_idempotent

WINDOW = datetime(2026, 11, 1, tzinfo=UTC)


def main() -> None:
    url = os.environ["FLEET_MODEL_URL"]

    def model(raw: dict[str, Any]) -> ModelAnswer:
        request = urllib.request.Request(
            url,
            data=json.dumps({"job": "long-lived", **raw}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310
            body = json.load(answer)
        usage = ModelUsage("fleet-model", body["input_tokens"], body["output_tokens"])
        return ModelAnswer({"summary": body["summary"]}, usage)

    with RunLedger(os.environ["IDEMPOTENT_JOBS_DATABASE_URL"]) as ledger:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            subject = line.strip()
            try:
                outcome = run_idempotent(
                    ledger,
                    RunIdentity("long-lived", subject, WINDOW, "v1"),
                    collect=lambda identity: {"region": identity.subject_id, "day": "2026-11-01"},
                    transform=model,
                )
                said = {"subject": subject, "status": outcome.status, "executed": outcome.executed}
            except Exception as exc:  # reported to the test, which fails on it
                said = {"subject": subject, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(said), flush=True)


if __name__ == "__main__":
    main()
