"""Prices with history, per token kind and tier, in one currency: golden usage payloads in each
provider's documented format priced to the cent, by the ledger (SQL) and by Python alike; a
price change never re-prices earlier calls; a dated model is priced by its prefix; tiny prices
are kept exactly; two currencies racing cannot both win; an unknown price is unknown."""

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from idempotent_jobs import (
    Budget,
    InvalidInputError,
    JobConfig,
    LedgerAdmin,
    ModelAnswer,
    ModelUsage,
    run_idempotent,
)
from idempotent_jobs.models.anthropic_messages import anthropic_usage
from idempotent_jobs.models.openai_chat import openai_usage
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)

# OpenAI's chat completion usage, as its API reference documents it (cached input is part of
# prompt_tokens; reasoning is part of completion_tokens).
OPENAI_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-golden",
    "object": "chat.completion",
    "created": 1_764_000_000,
    "model": "gpt-4o-2024-08-06",
    "service_tier": "default",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "{}", "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 128,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
}
# Anthropic's message usage, as its API reference documents it (input_tokens leaves out the
# cached reads and the cache writes; cache_creation splits the writes by their lifetime).
ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_golden",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "{}"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 50,
        "cache_creation_input_tokens": 2000,
        "cache_read_input_tokens": 10000,
        "output_tokens": 400,
        "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 1500},
        "service_tier": "standard",
    },
}


def _golden_usages() -> tuple[ModelUsage, ModelUsage]:
    import anthropic.types
    import openai.types.chat

    completion = openai.types.chat.ChatCompletion.model_validate(OPENAI_COMPLETION)
    message = anthropic.types.Message.model_validate(ANTHROPIC_MESSAGE)
    return openai_usage(completion, "gpt-4o"), anthropic_usage(message, "claude-sonnet-4-5")


def _record(ledger: HarnessLedger, subject: str, usage: ModelUsage, model: str = "m") -> str:
    ident = identity(subject=subject)
    run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"x": 1},
        transform=lambda raw: ModelAnswer({"summary": "ok"}, usage),
        config=JobConfig.of(prompt="", model=model, validator=""),
    )
    return ident.run_id


def _money(admin: LedgerAdmin, run_id: str) -> list[Decimal | None]:
    return list(admin.call_costs(run_id).values())


def test_golden_payloads_of_both_providers_are_priced_to_the_cent(ledger: HarnessLedger) -> None:
    openai_used, anthropic_used = _golden_usages()
    assert (
        openai_used.input_tokens,
        openai_used.cache_read_tokens,
        openai_used.output_tokens,
        openai_used.reasoning_tokens,
        openai_used.provider_name,
        openai_used.tier,
    ) == (2006, 1920, 300, 128, "openai", None)
    assert (
        anthropic_used.input_tokens,
        anthropic_used.cache_read_tokens,
        anthropic_used.cache_write_tokens,
        anthropic_used.cache_write_1h_tokens,
        anthropic_used.output_tokens,
    ) == (12_050, 10_000, 2000, 1500, 400)
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price(
            "gpt-4o", "2.50", "10.00", cache_read_per_million="1.25", effective_from=LONG_AGO
        )
        admin.set_price(
            "claude-sonnet-4-5",
            "3",
            "15",
            cache_read_per_million="0.30",
            cache_write_per_million="3.75",
            cache_write_1h_per_million="6",
            effective_from=LONG_AGO,
        )
        openai_run = _record(ledger, "openai", openai_used)
        anthropic_run = _record(ledger, "anthropic", anthropic_used)
        # 86 uncached at 2.50, 1,920 cached at 1.25, 300 output (reasoning too) at 10.
        openai_cost = Decimal("0.005615")
        # 50 at 3, 10,000 read at 0.30, 500 written for 5 minutes at 3.75, 1,500 written for an
        # hour at 6, 400 output at 15.
        anthropic_cost = Decimal("0.020025")
        assert _money(admin, openai_run) == [openai_cost]
        assert _money(admin, anthropic_run) == [anthropic_cost]
        for run_id, cost in ((openai_run, openai_cost), (anthropic_run, anthropic_cost)):
            [call] = admin.model_calls(run_id)
            assert call.money == cost  # the figure stored with the call is every report's
        # At the 5-minute rate the hour's writes are 37.5% short: 5,625 where 9,000 is owed.
        hour_at_5m = Decimal(1500) * Decimal("3.75")
        assert 1 - hour_at_5m / (Decimal(1500) * 6) == Decimal("0.375")


def test_a_price_change_never_reprices_earlier_calls(ledger: HarnessLedger) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m", "1", "1", effective_from=LONG_AGO)
        before = _record(ledger, "before", ModelUsage("m", 1000, 0))
        admin.set_price("m", "2", "2")  # from now on
        future = admin.database_now() + timedelta(days=30)
        admin.set_price("m", "100", "100", effective_from=future)  # not yet in force
        after = _record(ledger, "after", ModelUsage("m", 1000, 0))
        assert _money(admin, before) == [Decimal("0.001")]
        assert _money(admin, after) == [Decimal("0.002")]
        [spend] = admin.spend_by_job()
        assert spend.cost == Decimal("0.003") and spend.priced
        assert [str(p.input_per_million) for p in admin.prices()] == ["1", "2", "100"]


def test_a_dated_model_is_priced_by_its_prefix_and_an_exact_name_wins(
    ledger: HarnessLedger,
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("gpt-4o", "2.5", "10", prefix=True, effective_from=LONG_AGO)
        dated = _record(ledger, "dated", ModelUsage("gpt-4o-2024-08-06", 1_000_000, 0))
        admin.set_price("gpt-4o-2024-11-20", "1", "1", effective_from=LONG_AGO)
        exact = _record(ledger, "exact", ModelUsage("gpt-4o-2024-11-20", 1_000_000, 0))
        other = _record(ledger, "other", ModelUsage("gpt-4.1", 1_000_000, 0))
        assert _money(admin, dated) == [Decimal("2.5")]
        assert _money(admin, exact) == [Decimal("1")]
        assert _money(admin, other) == [None]  # no price: unknown, never 0
        matches = {m["model_pattern"]: m for m in admin.price_matches()}
        assert matches["gpt-4o"]["models"] == ["gpt-4o-2024-08-06"]
        assert matches["gpt-4o-2024-11-20"]["calls"] == 1
        assert matches[None]["models"] == ["gpt-4.1"]


def test_a_batch_tier_price_applies_to_batch_calls_only(ledger: HarnessLedger) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m", "2", "8", effective_from=LONG_AGO)
        admin.set_price("m", "1", "4", tier="batch", effective_from=LONG_AGO)
        online = _record(ledger, "online", ModelUsage("m", 1_000_000, 1_000_000))
        batch = _record(ledger, "batch", ModelUsage("m", 1_000_000, 1_000_000, tier="batch"))
        flex = _record(ledger, "flex", ModelUsage("m", 1_000_000, 1_000_000, tier="flex"))
        assert _money(admin, online) == [Decimal(10)]
        assert _money(admin, batch) == [Decimal(5)]
        assert _money(admin, flex) == [Decimal(10)]  # no flex price: the standard one


def test_tiny_prices_and_large_totals_are_kept_exactly(ledger: HarnessLedger) -> None:
    """``0.0000004`` used to be stored as 0."""
    with LedgerAdmin.beside(ledger) as admin:
        price = admin.set_price("tiny", "0.0000004", "0.001", effective_from=LONG_AGO)
        assert price.input_per_million == Decimal("0.0000004")
        run_id = _record(ledger, "tiny", ModelUsage("tiny", 1_000_000_000, 1_000_000_000))
        assert _money(admin, run_id) == [Decimal("1.0004")]
        admin.set_price("huge", "999999", "0", effective_from=LONG_AGO)
        run_id = _record(ledger, "huge", ModelUsage("huge", 1_000_000_000, 0))
        assert _money(admin, run_id) == [Decimal("999999000")]
        with pytest.raises(InvalidInputError) as bad:
            admin.set_price("m", "1000000000", "1")
        assert bad.value.field == "input_per_million"


def _race_currencies(database: str) -> tuple[list[str], list[str]]:
    """Two operators set a first price at once, in USD and in EUR."""
    gate = threading.Barrier(2)
    won: list[str] = []
    refused: list[str] = []

    def set_in(currency: str) -> None:
        with LedgerAdmin(database) as admin:
            gate.wait(timeout=30)
            try:
                admin.set_price(f"m-{currency}", "1", "1", currency=currency)
                won.append(currency)
            except InvalidInputError as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=set_in, args=(c,)) for c in ("USD", "EUR")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return won, refused


def test_two_currencies_racing_cannot_both_win(ledger: HarnessLedger, database: str) -> None:
    """Check-then-write let both through 29 times in 30; the database now decides."""
    for attempt in range(30):
        with ledger.connection() as conn:
            conn.execute("DELETE FROM idempotent_jobs.price_history")
            conn.execute("DELETE FROM idempotent_jobs.ledger_currency")
        won, refused = _race_currencies(database)
        assert len(won) == 1 and len(refused) == 1, (attempt, won, refused)
        assert "the ledger's prices are in" in refused[0]
        with LedgerAdmin(database) as admin:
            assert {p.currency for p in admin.prices()} == {won[0]} == {admin.currency()}


def test_a_call_with_no_usage_or_no_price_shows_unknown(ledger: HarnessLedger) -> None:
    """A failed call with no model showed 0.000000; one with no price showed -."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m", "1", "1", effective_from=LONG_AGO)
        silent = _record(ledger, "silent", ModelUsage("m"))
        assert _money(admin, silent) == [None]
        [spend] = admin.spend_by_job()
        # In doubt: counted apart, and no part of the money (which is known: nothing else).
        assert spend.unknown_calls == 1 and spend.priced and spend.cost is None


@pytest.mark.parametrize("held_by", ["claim", "call"])
def test_a_call_admitted_before_its_model_was_known_is_priced_by_the_model_it_used(
    ledger: HarnessLedger, held_by: str
) -> None:
    """A tokens budget's hold taken with no model named (``run_idempotent`` with no ``model`` in
    its configuration: the claim's hold, or the call's own) fixed no price: the call is priced
    by the price in force for the model it reported when it was admitted, not left unpriced."""
    ident = identity(subject=f"unnamed-{held_by}")
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("m-used", "2", "10", effective_from=LONG_AGO)
        admin.set_budget(Budget(amount=10**6), job_name=ident.job_name)
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"x": 1},
            transform=lambda raw: ModelAnswer({"summary": "ok"}, ModelUsage("m-used", 1000, 100)),
            max_tokens_per_call=2000 if held_by == "claim" else None,
        )
        # 1000 x 2 + 100 x 10 per million tokens
        assert _money(admin, ident.run_id) == [Decimal("0.003")]
        admin.set_price("m-used", "7", "7")  # later: it reprices nothing
        assert _money(admin, ident.run_id) == [Decimal("0.003")]
