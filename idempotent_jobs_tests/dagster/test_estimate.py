"""``estimate``: each partition once however the subjects are named, a partition whose input is
already collected scaled by its size, low/expected/high from the history, unknown money left
unknown."""

from datetime import UTC, datetime
from typing import Any

from idempotent_jobs import LedgerAdmin, ModelAnswer, ModelUsage, run_idempotent
from idempotent_jobs.operator.estimate import estimate
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.specs import job_spec

SPEC = job_spec("estimated", subjects=["a", "b", "c"], start="2026-11-01")


def _run(ledger: HarnessLedger, key: str, text: str, tokens: int) -> None:
    """One accepted run of partition ``key`` whose input is ``text``, its call ``tokens``."""
    run_idempotent(
        ledger,
        SPEC.identity_for(key),
        collect=lambda i: {"text": text},
        transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m", tokens - 10, 10)),
    )


def test_an_estimate_counts_each_partition_once_and_scales_collected_inputs(
    ledger: HarnessLedger,
) -> None:
    _run(ledger, "a|2026-11-01", "x" * 1000, 500)
    _run(ledger, "b|2026-11-01", "x" * 1000, 500)
    _run(ledger, "c|2026-11-01", "x" * 1000, 700)
    # A partition whose input is already collected, four times the history's size.
    _, lease = ledger.begin(SPEC.identity_for("a|2026-11-02"), "w", 30)
    assert lease is not None
    ledger.checkpoint(lease, {"text": "x" * 4000})
    ledger.release(lease)
    with LedgerAdmin.beside(ledger) as admin:
        twice = estimate(admin, SPEC, "2026-11-01", "2026-11-03", ["a", "a"])
        once = estimate(admin, SPEC, "2026-11-01", "2026-11-03", ["a"])
        assert (twice.partitions, twice.done, twice.to_compute) == (3, 1, 2)  # not doubled
        assert twice.expected_tokens == once.expected_tokens
        every: Any = estimate(admin, SPEC, "2026-11-01", "2026-11-03")
    assert (every.partitions, every.done, every.to_compute, every.sized) == (9, 3, 6, 1)
    h = every.history
    assert (h.p10_tokens, h.median_tokens, h.p90_tokens) == (500, 500, 660)
    per_byte = (500 + 500 + 700) / (3 * len('{"text": "' + "x" * 1000 + '"}'))
    assert h.tokens_per_input_byte is not None and abs(h.tokens_per_input_byte - per_byte) < 1e-9
    scaled = per_byte * len('{"text": "' + "x" * 4000 + '"}')  # about 4 x 567
    assert every.expected_tokens is not None
    assert abs(every.expected_tokens - (5 * 500 + scaled)) < 1e-6
    assert every.low_tokens is not None and every.high_tokens is not None
    assert every.low_tokens <= every.expected_tokens <= every.high_tokens
    assert any("input collected" in b for b in every.basis)
    # No price for the model: money is unknown, not 0.
    assert every.expected_cost is None and not h.priced


def test_an_estimate_prices_at_the_history_of_prices(ledger: HarnessLedger) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m", "1", "1", effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    _run(ledger, "a|2026-11-01", "x", 1000)
    with LedgerAdmin.beside(ledger) as admin:
        result = estimate(admin, SPEC, "2026-11-01", "2026-11-02", ["a", "b"])
    assert result.to_compute == 3 and result.expected_cost == 3 * 0.001
    assert result.currency == "USD"


def test_an_estimate_shows_the_batch_lane_at_the_batch_tiers_price_side_by_side(
    ledger: HarnessLedger,
) -> None:
    _run(ledger, "a|2026-11-01", "x", 1000)
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m", "1", "1", effective_from=datetime(2020, 1, 1, tzinfo=UTC))
        no_batch_price = estimate(admin, SPEC, "2026-11-01", "2026-11-02", ["a", "b"])
        admin.set_price("m", "0.5", "0.5", tier="batch")
        result = estimate(admin, SPEC, "2026-11-01", "2026-11-02", ["a", "b"])
    # Without a batch price the batch figure is unknown, never the standard price.
    assert no_batch_price.batch_expected_cost is None
    assert not no_batch_price.history.batch_priced
    assert result.expected_cost == 3 * 0.001
    assert result.batch_expected_cost == 3 * 0.0005
