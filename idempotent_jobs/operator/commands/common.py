"""What every command shares: the ledger and the code location from the global options, the
numeric option types, and how a result or a finding list is printed."""

import argparse
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.constants import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_OUTBOX_AGE_SECONDS,
)
from idempotent_jobs.operator.render import table, to_json

if TYPE_CHECKING:
    from idempotent_jobs.core.admin import LedgerAdmin
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.operator.code_location import Workspace

#: The largest value each kind of numeric option takes: a number past these is a typo, and
#: would overflow a date or a libpq setting further on.
MAX_SECONDS = 3600.0 * 24 * 366 * 10  # ten years
MAX_DAYS = 366.0 * 100  # a century
MAX_COUNT = 10_000_000


@dataclass(frozen=True)
class Shared:
    """Options several commands take, as argparse parents: ``--json``, and the health
    thresholds of ``doctor`` and ``reconcile``."""

    json_flag: argparse.ArgumentParser
    health: argparse.ArgumentParser

    @classmethod
    def build(cls) -> "Shared":
        json_flag = argparse.ArgumentParser(add_help=False)
        json_flag.add_argument("--json", action="store_true", help="machine-readable output")
        health = argparse.ArgumentParser(add_help=False)
        health.add_argument(
            "--outbox-age",
            type=positive(float, MAX_SECONDS, zero=True),
            default=DEFAULT_OUTBOX_AGE_SECONDS,
            help="seconds after which an undelivered notification is a problem",
        )
        health.add_argument(
            "--max-attempts",
            type=positive(int),
            default=DEFAULT_MAX_ATTEMPTS,
            help="a failed run with this many attempts is a problem",
        )
        return cls(json_flag, health)


def ensure_database_url() -> str:
    from idempotent_jobs.operator.embedded import ensure_database_url as ensure

    return ensure()


def open_admin(args: argparse.Namespace) -> "LedgerAdmin":
    """The ledger's operator face (listings, revise, drills, prices, migrate, retention), from
    the global options; every command but ``outbox deliver`` needs only this one."""
    from idempotent_jobs.core.admin import LedgerAdmin

    return LedgerAdmin(
        ensure_database_url(), schema=args.schema, connect_timeout_seconds=args.connect_timeout
    )


@contextmanager
def as_arguments(arguments: Mapping[str, str]) -> Iterator[None]:
    """Inside, an :class:`InvalidInputError` that names a field of the library (``amount``,
    ``input_per_million``) names the command's own argument instead (``--tokens``,
    ``--input``): the one line a bad argument gets says which argument to change."""
    from idempotent_jobs.core.errors import InvalidInputError

    try:
        yield
    except InvalidInputError as exc:
        argument = arguments.get(exc.field)
        if argument is None or argument == exc.field:
            raise
        raise InvalidInputError(argument, exc.reason) from None


def open_worker(args: argparse.Namespace) -> "RunLedger":
    """The ledger's worker face, for what a worker does from the command line: deliver the
    outbox (``outbox deliver``), run the demo."""
    from idempotent_jobs.core.ledger import RunLedger

    return RunLedger(
        ensure_database_url(), schema=args.schema, connect_timeout_seconds=args.connect_timeout
    )


def code_location(args: argparse.Namespace) -> "Workspace":
    """The user's code location, found as Dagster's CLI finds it (see
    ``operator/code_location.py``): only the commands that need jobs or channels load it."""
    from idempotent_jobs.operator.code_location import load_workspace

    return load_workspace(
        module=args.module_name,
        python_file=args.python_file,
        attribute=args.attribute,
        workspace=args.workspace,
    )


def when(text: str) -> datetime:
    """An argparse type: a moment with its zone (``2026-08-07T09:00+02:00``), or a plain date
    (``2026-08-07``: its start, UTC, as run windows are)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (2026-08-07) or a time with its zone (2026-08-07T00:00Z)"
        ) from None
    if value.tzinfo is None and len(text.strip()) == len("2026-08-07"):
        return value.replace(tzinfo=UTC)  # a plain date: its start, in UTC
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a timezone, e.g. 2026-08-07T00:00Z")
    return value


def positive(
    kind: type[int] | type[float], maximum: float = MAX_COUNT, *, zero: bool = False
) -> Any:
    """An argparse type: a finite number > 0 (>= 0 with ``zero``) and <= ``maximum`` (else
    exit 2, saying why)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < 0 or (value == 0 and not zero):
            least = "at least 0" if zero else "greater than 0"
            raise argparse.ArgumentTypeError(f"must be {least}, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(to_json(data) if args.json else human)


def print_findings(args: argparse.Namespace, findings: list[Any], checks: list[str]) -> int:
    problems = [f for f in findings if f.severity == "problem"]
    human = "\n".join(
        [
            *checks,
            "",
            table(
                ["severity", "kind", "run", "detail"],
                [(f.severity, f.kind, (f.run_id or "-")[:12], f.detail) for f in findings],
            ),
        ]
        + [f"\n{len(problems)} problem(s), {len(findings) - len(problems)} informational"]
    )
    emit(args, {"checks": checks, "findings": findings, "problems": len(problems)}, human)
    return 1 if problems else 0
