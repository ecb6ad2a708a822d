"""Delivery never loses a notification and never leaks a credential: a row is delivered only
after a 2xx from the configured URL, redirects are not followed, and keys cannot collide."""

import time
from collections.abc import Iterator

import pytest

from idempotent_jobs import InvalidInputError
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.resources import WebhookChannel
from idempotent_jobs_tests.chaos.parts import CHAOS_AUTHORIZATION as SECRET
from idempotent_jobs_tests.chaos.parts import FAULTS, Receiver
from idempotent_jobs_tests.helpers import claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


@pytest.fixture
def endpoints() -> Iterator[tuple[Receiver, Receiver]]:
    """The configured receiver, and another address its redirects point to."""
    elsewhere = Receiver()
    receiver = Receiver(trap=elsewhere, slow_seconds=1.5)  # longer than the channel's timeout
    yield receiver, elsewhere
    receiver.close()
    elsewhere.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_row_is_delivered_only_after_a_2xx_and_each_key_is_received_once(
    ledger: HarnessLedger, operator: LedgerAdmin, endpoints: tuple[Receiver, Receiver], fault: str
) -> None:
    receiver, elsewhere = endpoints
    ident = identity()
    lease = claimed(ledger, ident)
    ledger.complete(lease, {"summary": "s"}, {"hook": {"summary": "s"}})
    channel = WebhookChannel(url=receiver.url, authorization=SECRET, timeout_seconds=0.5)

    receiver.faults = [fault]
    started = time.monotonic()
    report = ledger.deliver_outbox(channel.send)
    assert time.monotonic() - started < 5
    [(row, reason)] = report.failed
    assert report.delivered == []
    [pending] = operator.outbox(ident.run_id, pending_only=True)
    assert pending.delivered_at is None and pending.delivery_attempts == 1
    assert pending.last_error == reason
    if fault.isdigit():
        assert f"HTTP {fault}" in reason
    assert elsewhere.seen == [], "a redirect is not followed: nothing reaches another address"

    report = ledger.deliver_outbox(channel.send)
    assert [r.idempotency_key for r in report.delivered] == [f"{ident.run_id}:hook"]
    [done] = operator.outbox(ident.run_id)
    assert done.delivered_at is not None and done.delivery_attempts == 2
    keys = [s.key for s in receiver.seen]
    assert keys == [f"{ident.run_id}:hook"] * 2, "the retry carries the same key"
    assert {s.method for s in receiver.seen} == {"POST"}
    assert all(s.body == b'{"summary": "s"}' for s in receiver.seen)
    assert all(s.authorization == SECRET for s in receiver.seen)
    assert ledger.deliver_outbox(channel.send).delivered == [], "delivered rows are not re-sent"


def test_a_redirect_error_names_the_target_and_no_credential_goes_there(
    ledger: HarnessLedger, endpoints: tuple[Receiver, Receiver]
) -> None:
    receiver, elsewhere = endpoints
    lease = claimed(ledger, identity())
    ledger.complete(lease, {"summary": "s"}, {"hook": {"summary": "s"}})
    receiver.faults = ["302"]
    channel = WebhookChannel(url=receiver.url, authorization=SECRET, timeout_seconds=2)
    [(_, reason)] = ledger.deliver_outbox(channel.send).failed
    assert "HTTP 302" in reason and elsewhere.url in reason and "not followed" in reason
    assert SECRET not in reason and elsewhere.seen == []


@pytest.mark.parametrize("name", ["ops:r1", "email:ops@acme.example", "a:b"])
def test_a_channel_name_that_could_forge_another_key_is_refused(
    ledger: HarnessLedger, operator: LedgerAdmin, name: str
) -> None:
    """``ops:r1`` at revision 0 and ``ops`` at revision 1 would both be ``<id>:ops:r1``."""
    ident = identity()
    lease = claimed(ledger, ident)
    with pytest.raises(InvalidInputError) as info:
        ledger.complete(lease, {"summary": "s"}, {name: {"n": 1}})
    assert info.value.field == "notifications" and repr(name) in str(info.value)
    ledger.complete(lease, {"summary": "s"}, {"ops": {"n": 1}})
    with pytest.raises(InvalidInputError) as revised:
        operator.revise(ident.run_id, "again", channels=[name])
    assert revised.value.field == "channels"
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed" and record.revision == 0


def test_keys_of_channels_and_revisions_are_all_distinct(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    lease = claimed(ledger, ident)
    ledger.complete(lease, {"summary": "s"}, {"ops": {"n": 0}, "ops-r1": {"n": 0}})
    operator.revise(ident.run_id, "again", channels=["ops", "ops-r1"])
    lease = claimed(ledger, ident, "w2")
    ledger.complete(lease, {"summary": "t"}, {"ops": {"n": 1}, "ops-r1": {"n": 1}})
    keys = [row.idempotency_key for row in operator.outbox(ident.run_id)]
    assert len(keys) == 4 and len(set(keys)) == 4, keys
