"""Hostile input: every bad value gets a typed error naming the field, or a recorded failure;
nothing stored is lost or overwritten; no secret reaches an error or a log line."""

import hashlib
import logging
import math
import socket
import threading
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotent_jobs import (
    InvalidInputError,
    LedgerConnectionError,
    LedgerError,
    LedgerPermissionError,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.identity import MAX_FIELD_LENGTH
from idempotent_jobs.core.json_values import MAX_JSON_BYTES
from idempotent_jobs.dagster.resources import WebhookChannel
from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY
from idempotent_jobs_tests.helpers import Collector, claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

NINE = datetime(2026, 8, 7, 9, tzinfo=UTC)
DB_EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@given(job=st.text(max_size=600), subject=st.text(max_size=600), version=st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_identity_text_is_valid_or_refused_naming_the_field(
    job: str, subject: str, version: str
) -> None:
    try:
        ident = RunIdentity(job, subject, NINE, version)
    except InvalidInputError as exc:
        assert exc.field in {"job_name", "subject_id", "version"}
        return
    for value in (ident.job_name, ident.subject_id, ident.version):
        assert value and value == value.strip() and "|" not in value
        assert len(value) <= MAX_FIELD_LENGTH
        assert not [c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    recipe = f"{ident.job_name}|{ident.subject_id}|2026-08-07T09:00:00+00:00|{ident.version}"
    assert ident.run_id == hashlib.sha256(recipe.encode()).hexdigest()


@given(
    moment=st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.timezones()
    )
)
@settings(max_examples=300, deadline=None)
def test_any_aware_datetime_means_its_utc_instant(moment: datetime) -> None:
    ident = RunIdentity("job", "subject", moment, "v1")
    utc = moment.astimezone(UTC).replace(microsecond=0)
    assert ident.scheduled_at == utc
    assert ident.run_id == RunIdentity("job", "subject", utc, "v1").run_id


@given(moment=st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)))
@settings(max_examples=50, deadline=None)
def test_naive_datetimes_are_refused(moment: datetime) -> None:
    with pytest.raises(InvalidInputError) as info:
        RunIdentity("job", "subject", moment, "v1")
    assert info.value.field == "scheduled_at"


def test_dst_edges_give_distinct_utc_instants() -> None:
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    first = datetime(2026, 10, 25, 2, 30, fold=0, tzinfo=berlin)  # CEST, 00:30 UTC
    second = datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=berlin)  # CET, 01:30 UTC
    assert first.astimezone(UTC) + timedelta(hours=1) == second.astimezone(UTC)
    assert RunIdentity("j", "s", first, "v").run_id != RunIdentity("j", "s", second, "v").run_id
    plus_two = datetime(2026, 10, 25, 2, 30, tzinfo=timezone(timedelta(hours=2)))
    assert RunIdentity("j", "s", first, "v") == RunIdentity("j", "s", plus_two, "v")


@given(key=st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_partition_keys_map_to_an_identity_or_a_typed_error(key: str) -> None:
    try:
        ident = COMPETITOR_SUMMARY.identity_for(key)
    except InvalidInputError as exc:
        assert exc.field == "partition_key"
        return
    assert ident.subject_id in COMPETITOR_SUMMARY.subjects
    assert key.startswith(f"{ident.subject_id}|")


json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.floats()
json_like = st.recursive(
    json_leaf | st.binary(max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(output=st.dictionaries(st.text(max_size=8), json_like, max_size=4))
@DB_EXAMPLES
def test_an_output_is_stored_exactly_or_refused_and_nothing_changes(
    ledger: HarnessLedger, output: dict[str, Any]
) -> None:
    ident = identity(subject=f"h-{hashlib.sha1(repr(output).encode()).hexdigest()[:16]}")
    if (record := ledger.get(ident.run_id)) is not None and record.status == "completed":
        return  # hypothesis may repeat an example
    lease = claimed(ledger, ident, "w", 30)
    before = ledger.get(ident.run_id)
    try:
        done = ledger.complete(lease, output)
    except InvalidInputError as exc:
        assert exc.field == "output"
        assert ledger.get(ident.run_id) == before
        return
    stored = ledger.get(ident.run_id)
    assert stored is not None and stored.output == done.output
    assert _equal_json(stored.output, output)


def _equal_json(stored: Any, given_value: Any) -> bool:
    if isinstance(given_value, float):
        return math.isclose(stored, given_value, rel_tol=1e-12, abs_tol=0) or stored == given_value
    if isinstance(given_value, dict):
        return stored.keys() == given_value.keys() and all(
            _equal_json(stored[k], v) for k, v in given_value.items()
        )
    if isinstance(given_value, list | tuple):
        return len(stored) == len(given_value) and all(
            _equal_json(a, b) for a, b in zip(stored, given_value, strict=True)
        )
    return bool(stored == given_value)


def test_huge_and_deep_values(ledger: HarnessLedger, database: str) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w", 60)
    with pytest.raises(InvalidInputError, match="larger than"):
        ledger.save_raw_input(lease, {"blob": "x" * (MAX_JSON_BYTES + 1)})
    nested: Any = "leaf"
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(InvalidInputError, match="raw_input"):
        ledger.save_raw_input(lease, {"deep": nested})
    five_mb = {"documents": ["word " * 1_000_000]}
    with pytest.raises(InvalidInputError, match="raw_input: is 5,000,018 bytes as JSON"):
        ledger.save_raw_input(lease, five_mb)  # over the default limit of 1 MiB
    with HarnessLedger(database, max_raw_input_bytes=8 * 1024 * 1024) as roomy:
        assert roomy.save_raw_input(lease, five_mb) == five_mb
        assert roomy.save_raw_input(lease, {"documents": []}) == five_mb, "the checkpoint stays"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            "plain text, not a dict",
            "InvalidInputError: output: must be a JSON object (dict), got str",
        ),
        ({"summary": float("nan")}, "InvalidInputError: output: is not storable as JSON"),
        (None, "InvalidInputError: output: must be a JSON object (dict), got NoneType"),
        (RuntimeError("model crashed"), "RuntimeError: model crashed"),
    ],
)
def test_bad_model_answers_become_recorded_failures(
    ledger: HarnessLedger, operator: LedgerAdmin, answer: Any, reason: str
) -> None:
    def model(raw: dict[str, Any]) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    with pytest.raises((InvalidInputError, RuntimeError)):
        run_idempotent(ledger, identity(), collect=Collector(), transform=model)
    record = ledger.get(identity().run_id)
    assert record is not None and record.status == "failed" and record.output is None
    assert record.last_error is not None and record.last_error.startswith(reason)
    assert operator.outbox(identity().run_id) == []
    done = run_idempotent(
        ledger, identity(), collect=Collector(), transform=lambda raw: {"summary": "fine"}
    )
    assert done.executed and done.output == {"summary": "fine"}


def test_a_huge_answer_is_stored_whole(database: str) -> None:
    """Within a raised limit: the default refuses more than 1 MiB."""
    text = "sentence. " * 300_000  # 3 MB
    with HarnessLedger(database, max_output_bytes=4 * 1024 * 1024) as ledger:
        done = run_idempotent(
            ledger,
            identity(),
            collect=Collector(),
            transform=lambda raw: ModelAnswer({"summary": text}, ModelUsage("m", 10, 900_000)),
        )
        stored = ledger.get(identity().run_id)
    assert stored is not None and stored.output == {"summary": text} == done.output


def closing_server() -> tuple[str, threading.Event]:
    """A TCP server on 127.0.0.1 that accepts a request and closes the socket unanswered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/hook", stop


def test_a_webhook_closing_the_socket_is_a_recorded_failure(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    lease = claimed(ledger, identity(), "w", 30)
    ledger.complete(lease, {"summary": "s"}, {"hook": {"summary": "s"}})
    url, stop = closing_server()
    try:
        report = ledger.deliver_outbox(WebhookChannel(url=url, timeout_seconds=2).send)
    finally:
        stop.set()
    [(row, reason)] = report.failed
    assert row.channel == "hook" and "Disconnected" in reason or "reset" in reason.lower()
    [pending] = operator.outbox(pending_only=True)
    assert pending.delivery_attempts == 1 and pending.last_error == reason


def test_no_secret_in_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t-Pa55"
    caplog.set_level(logging.DEBUG)
    ledger = HarnessLedger(
        f"postgresql://ledger:{secret}@127.0.0.1:9/ledger", connect_timeout_seconds=1
    )
    with pytest.raises(LedgerConnectionError) as info:
        ledger.open()
    with pytest.raises(LedgerConnectionError) as migrate_info:
        LedgerAdmin.beside(ledger).migrate()
    channel = WebhookChannel(url="http://127.0.0.1:9/hook", authorization=f"Bearer {secret}")
    texts = [str(info.value), str(migrate_info.value), repr(ledger), repr(channel)]
    texts += [record.getMessage() for record in caplog.records]
    assert "127.0.0.1" in str(info.value), "the real cause is reported"
    assert not [t for t in texts if secret in t]


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidInputError) as info:
        RunIdentity("job", "acme\ud800", NINE, "v1")
    assert info.value.field == "subject_id"


def test_a_role_that_may_not_create_the_schema_gets_a_clear_error(
    server_url: str, fresh_database: str
) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS ij_readonly_test")
        conn.execute("CREATE ROLE ij_readonly_test LOGIN PASSWORD 'Pa55-in-url'")
    try:
        params = psycopg.conninfo.conninfo_to_dict(fresh_database)
        params.update(user="ij_readonly_test", password="Pa55-in-url")
        url = psycopg.conninfo.make_conninfo("", **params)
        with pytest.raises(
            LedgerPermissionError, match="lacks a privilege: permission denied for database"
        ):
            LedgerAdmin(url, connect_timeout_seconds=2).migrate()
        with pytest.raises(LedgerError) as info:
            LedgerAdmin(url, connect_timeout_seconds=2).migrate()
        assert "Pa55-in-url" not in str(info.value)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS ij_readonly_test")
