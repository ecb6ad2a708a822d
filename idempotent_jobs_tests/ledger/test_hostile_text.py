"""What is stored can always be read back, and one identity is one run however it is typed."""

import hashlib
import sys
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from idempotent_jobs import CallOrigin, InvalidInputError, ModelUsage, RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.json_values import MAX_JSON_DEPTH, json_fingerprint
from idempotent_jobs_tests.helpers import Collector, claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def nested(levels: int) -> dict[str, Any]:
    """A dict ``levels`` deep (the outer dict is level 1)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


# -- nesting, surrogates, colliding keys --------------------------------------------------------


def test_nesting_is_limited_by_a_constant_not_by_the_stack(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    lease = claimed(ledger, ident)
    with pytest.raises(InvalidInputError, match=f"more than {MAX_JSON_DEPTH} levels") as info:
        ledger.complete(lease, nested(990))
    assert info.value.field == "output"
    with pytest.raises(InvalidInputError, match="more than 100 levels"):
        ledger.complete(lease, nested(MAX_JSON_DEPTH + 1))

    def deep_in_the_stack(depth: int) -> None:
        if depth:
            return deep_in_the_stack(depth - 1)
        ledger.complete(lease, nested(MAX_JSON_DEPTH))

    deep_in_the_stack(sys.getrecursionlimit() - 200)  # the same limit with less stack left
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"
    assert record.output == nested(MAX_JSON_DEPTH), "what was stored reads back"
    assert operator.list_runs()[0].output == nested(MAX_JSON_DEPTH)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"text": "lone \ud800 surrogate"}, "lone surrogate"),
        ({"key \udfff": "v"}, "lone surrogate"),
        ({1: "a", "1": "b"}, "two keys that are both '1'"),
        ({True: "a", "true": "b"}, "two keys that are both 'true'"),
        ({None: "a", "null": "b"}, "two keys that are both 'null'"),
        ({(1, 2): "a"}, "keys must be strings"),
        ({"list": [1, [2, {"x": float("inf")}]]}, "not storable"),
    ],
)
def test_unreadable_text_and_colliding_keys_are_refused_before_any_write(
    ledger: HarnessLedger, value: dict[Any, Any], reason: str
) -> None:
    ident = identity()
    lease = claimed(ledger, ident)
    for field, write in (
        ("raw_input", lambda: ledger.checkpoint(lease, value)),
        ("output", lambda: ledger.complete(lease, value)),
        ("notifications['hook']", lambda: ledger.complete(lease, {"s": 1}, {"hook": value})),
    ):
        with pytest.raises(InvalidInputError, match=reason) as info:
            write()
        assert info.value.field == field
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.raw_input) == ("running", None)


def test_scalar_keys_that_do_not_collide_are_stored_as_json_writes_them(
    ledger: HarnessLedger,
) -> None:
    lease = claimed(ledger, identity())
    keys_json_turns_into_text: dict[Any, Any] = {1: "a", 2.5: "b", False: "c", "x": {None: 1}}
    done = ledger.complete(lease, keys_json_turns_into_text)
    assert done.output == {"1": "a", "2.5": "b", "false": "c", "x": {"null": 1}}


def test_the_fingerprint_is_canonical() -> None:
    assert json_fingerprint({"b": 1, "a": [1, 2]}) == json_fingerprint({"a": [1, 2], "b": 1})
    expected = hashlib.sha256('{"a":[1,2],"b":"é"}'.encode()).hexdigest()
    assert json_fingerprint({"b": "é", "a": [1, 2]}) == expected


@pytest.mark.parametrize(
    ("field", "call"),
    [
        (
            "requested_by",
            lambda ledger, operator, run_id: operator.revise(run_id, "r", requested_by="x" * 201),
        ),
        (
            "requested_by",
            lambda ledger, operator, run_id: operator.revise(run_id, "r", requested_by="a\x1bb"),
        ),
        ("reason", lambda ledger, operator, run_id: operator.revise(run_id, "x" * 2001)),
        (
            "channels",
            lambda ledger, operator, run_id: operator.revise(run_id, "r", channels=["c" * 101]),
        ),
        ("worker_id", lambda ledger, operator, run_id: ledger.claim(run_id, "w" * 201, 30)),
        (
            "caller_step",
            lambda ledger, operator, run_id: ledger.claim(
                run_id, "w", 30, origin=CallOrigin(caller_step="s" * 201)
            ),
        ),
        (
            "caller_run_id",
            lambda ledger, operator, run_id: ledger.claim(
                run_id, "w", 30, origin=CallOrigin(caller_run_id="d\nx")
            ),
        ),
    ],
)
def test_every_free_text_column_has_a_limit(
    ledger: HarnessLedger, operator: LedgerAdmin, field: str, call: Any
) -> None:
    ident = identity()
    lease = claimed(ledger, ident)
    ledger.complete(lease, {"summary": "s"})
    with pytest.raises(InvalidInputError) as info:
        call(ledger, operator, ident.run_id)
    assert info.value.field == field
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.revision) == ("completed", 0)


def test_a_model_name_from_the_provider_is_trimmed_not_refused(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """It comes with an answer already paid for: refusing it would throw the answer away."""
    ident = identity()
    lease = claimed(ledger, ident)
    done = ledger.complete(lease, {"summary": "s"}, usage=ModelUsage("m\x1b" + "m" * 300, 1, 1))
    assert done.accepted
    [attempt] = operator.attempts(ident.run_id)
    assert attempt.model_name == "m?" + "m" * 198


# -- identity normalisation ---------------------------------------------------------------------

NINE = datetime(2026, 8, 7, 9, tzinfo=UTC)


def test_nfc_and_nfd_are_one_run_with_one_model_call(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    from idempotent_jobs import run_idempotent

    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert nfc != nfd and unicodedata.normalize("NFC", nfd) == nfc
    first = RunIdentity("job", nfd, NINE, "v1")
    second = RunIdentity("job", f"  {nfc}", NINE, "v1")
    assert first == second and first.run_id == second.run_id
    assert first.subject_id == nfc
    expected = hashlib.sha256(f"job|{nfc}|2026-08-07T09:00:00+00:00|v1".encode()).hexdigest()
    assert first.run_id == expected, "NFC text hashes exactly as the published recipe"
    calls = []

    def transform(raw: dict[str, Any]) -> dict[str, Any]:
        calls.append(raw)
        return {"summary": "s"}

    for ident in (first, second):
        run_idempotent(ledger, ident, collect=Collector(), transform=transform)
    assert len(calls) == 1 and len(operator.list_runs()) == 1


def test_ascii_ids_are_unchanged_by_normalisation() -> None:
    ident = RunIdentity("competitor-summary", "workspace-acme", NINE, "v1")
    text = "competitor-summary|workspace-acme|2026-08-07T09:00:00+00:00|v1"
    assert ident.run_id == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    "when",
    [
        datetime(1899, 12, 31, 23, tzinfo=UTC),
        datetime(9001, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),  # past datetime.max
        datetime(1, 1, 1, 0, tzinfo=timezone(timedelta(hours=5))),  # before datetime.min
        datetime(1900, 1, 1, 3, tzinfo=timezone(timedelta(hours=5))),  # 1899 in UTC
    ],
)
def test_windows_outside_1900_to_9000_in_utc_are_refused(when: datetime) -> None:
    with pytest.raises(InvalidInputError, match="1900-9000") as info:
        RunIdentity("job", "s", when, "v1")
    assert info.value.field == "scheduled_at"


def test_the_edges_of_the_window_range_are_accepted() -> None:
    RunIdentity("job", "s", datetime(1900, 1, 1, tzinfo=UTC), "v1")
    RunIdentity("job", "s", datetime(9000, 12, 31, 23, 59, 59, tzinfo=UTC), "v1")
