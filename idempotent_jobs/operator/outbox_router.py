"""Sending an outbox row through the channel of the code location that owns its job."""

from dataclasses import dataclass

from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import OutboxRecord
from idempotent_jobs.dagster.resources import NotificationChannel
from idempotent_jobs.operator.code_location import CodeLocation


@dataclass(frozen=True, kw_only=True)
class OutboxRouter:
    """Sends each outbox row through a channel of the code location that owns the row's job:
    the job's spec names the channel, its location provides it. Rows of other jobs are never
    sent (:attr:`job_names` is what the deliverer asks the ledger for)."""

    owners: dict[str, CodeLocation]
    channels: dict[int, dict[str, NotificationChannel]]

    @property
    def job_names(self) -> list[str]:
        return sorted(self.owners)

    def send(self, row: OutboxRecord) -> None:
        location = self.owners.get(row.job_name or "")
        if location is None:  # the ledger was asked for owned jobs only: a row moved under us
            raise LedgerError(f"job {row.job_name!r} is not owned by the loaded code location")
        specs = [s for s in location.specs if normalize_text(s.identity_job_name) == row.job_name]
        if not any(row.channel in spec.channels for spec in specs):
            raise LedgerError(
                f"job {row.job_name!r} names no channel {row.channel!r} "
                f"(its channels: {', '.join(sorted({c for s in specs for c in s.channels}))})"
            )
        channel = self.channels[id(location)].get(row.channel)
        if channel is None:
            raise LedgerError(
                f"no notification channel resource named {row.channel!r} in "
                f"{location.target.describe()}"
            )
        channel.send(row)
