"""Fill an empty database with a ledger made by release 0.1's own code (run by make_fixture.py).

Run with release 0.1's checkout first on ``PYTHONPATH``; it imports only 0.1's modules. Argument:
the database URL. Prints, as JSON, what it made (run ids, idempotency keys, partition keys), which
make_fixture.py stores beside the dump for the upgrade test to compare with.
"""

import json
import sys
import unicodedata
from datetime import UTC, datetime
from pathlib import Path

from idempotent_jobs.identity import RunIdentity  # release 0.1's modules
from idempotent_jobs.ledger import RunLedger
from idempotent_jobs.partitions import load_subjects
from idempotent_jobs.protocol import ModelAnswer, run_idempotent
from idempotent_jobs.records import ModelUsage

DEEP_LEVELS = 989  # as deep as 0.1 could store under Python's default recursion limit


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def deep_value(levels: int) -> dict[str, object]:
    value: object = "bottom"
    for _ in range(levels - 1):
        value = [value]
    return {"tree": value}


def main() -> None:
    import idempotent_jobs

    assert "site-packages" not in idempotent_jobs.__file__, idempotent_jobs.__file__
    url = sys.argv[1]
    window = datetime(2026, 11, 2, tzinfo=UTC)
    made: dict[str, object] = {"release": "0.1"}
    runs: dict[str, str] = {}
    RunLedger(database_url=url).migrate()
    with RunLedger(database_url=url) as ledger:

        def run(name: str, subject: str, transform, notify=None) -> str:  # type: ignore[no-untyped-def]
            identity = RunIdentity("weekly-digest", subject, window, "v1")
            outcome = run_idempotent(
                ledger,
                identity,
                collect=lambda i: {"subject": i.subject_id, "items": [1, 2, 3]},
                transform=transform,
                notifications=notify,
                worker_id=f"release-0.1-worker:{name}",
            )
            runs[name] = outcome.run_id
            return outcome.run_id

        def answer(text: str) -> ModelAnswer:
            return ModelAnswer({"summary": text}, ModelUsage("gpt-0.1", 120, 30))

        # A subject stored in NFD, as a subjects.yaml typed on macOS spells it; two channels.
        run(
            "nfd",
            nfd("Société Générale"),
            lambda raw: answer("nfd summary"),
            lambda out: {"webhook": {"summary": out["summary"]}, "audit": {"seen": True}},
        )
        # The same name in NFC and in NFD: two runs under 0.1, which cannot be merged.
        run("twin_nfc", "Zoë", lambda raw: answer("nfc twin"))
        run("twin_nfd", nfd("Zoë"), lambda raw: answer("nfd twin"))
        # An output nested as deep as 0.1 stored it.
        sys.setrecursionlimit(10_000)
        run("deep", "deep-output", lambda raw: deep_value(DEEP_LEVELS))
        sys.setrecursionlimit(1_000)
        # A revised run: accepted, revised (notifying the webhook), accepted again.
        revised = run(
            "revised",
            "Globex",
            lambda raw: answer("first answer"),
            lambda out: {"webhook": {"summary": out["summary"]}},
        )
        ledger.revise(revised, "prompt fixed", channels=["webhook"], requested_by="operator")
        run(
            "revised",
            "Globex",
            lambda raw: answer("second answer"),
            lambda out: {"webhook": {"summary": out["summary"]}},
        )

        # A failed run: the model raised.
        def broken(raw: dict[str, object]) -> dict[str, object]:
            raise RuntimeError("model timed out")

        try:
            run("failed", "Initech", broken)
        except RuntimeError:
            pass
        runs["failed"] = RunIdentity("weekly-digest", "Initech", window, "v1").run_id

        # Deliver: the audit channel and the revised run's first notification go out; the
        # webhook is down for the NFD run and for the revision, whose rows stay pending.
        sent: list[str] = []

        def send(row) -> None:  # type: ignore[no-untyped-def]
            if row.channel == "webhook" and row.run_id == runs["nfd"]:
                raise ConnectionError("receiver down")
            if row.channel == "webhook" and row.revision == 1:
                raise ConnectionError("receiver down")
            sent.append(row.idempotency_key)

        ledger.deliver_outbox(send)
        made["delivered_keys"] = sorted(sent)
        made["pending_keys"] = sorted(
            row.idempotency_key for row in ledger.outbox(None, pending_only=True)
        )
    made["runs"] = runs

    subjects_file = Path(sys.argv[2])
    subjects_file.write_text(
        f"weekly-digest:\n  - {nfd('Société Générale')}\n  - Globex\n", encoding="utf-8"
    )
    made["subjects_yaml"] = subjects_file.read_text(encoding="utf-8")
    made["partition_subjects"] = load_subjects("weekly-digest", str(subjects_file))
    print(json.dumps(made, ensure_ascii=True, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
