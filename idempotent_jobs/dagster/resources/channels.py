"""Notification channels: where outbox rows go. Each send carries the row's idempotency key."""

import fcntl
import json
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from idempotent_jobs.core.project_paths import project_home
from idempotent_jobs.core.records import OutboxRecord


class NotificationChannel(dg.ConfigurableResource, ABC):  # type: ignore[type-arg]
    """Performs one side effect per outbox row; raising leaves the row to be retried."""

    @abstractmethod
    def send(self, row: OutboxRecord) -> None: ...


class JsonLinesChannel(NotificationChannel):
    """Offline: appends ``{"key", "payload"}`` lines to a file, skipping keys already written.

    The file is the receiver, so it deduplicates on the key itself (under a file lock): a row
    re-sent after a crash between send and mark is written once.
    """

    path: str = Field(
        default="",
        description="File to append to; default $IDEMPOTENT_JOBS_HOME/notifications.jsonl",
    )

    def target(self) -> Path:
        return Path(self.path) if self.path else project_home() / "notifications.jsonl"

    def send(self, row: OutboxRecord) -> None:
        target = self.target()
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            if any(
                json.loads(line)["key"] == row.idempotency_key for line in handle if line.strip()
            ):
                return
            handle.write(
                json.dumps({"key": row.idempotency_key, "payload": row.payload}, sort_keys=True)
                + "\n"
            )


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is an answer, not an instruction: following it would re-send the request
    (as a GET, body dropped, for 301/302) with the credentials to another address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


_OPENER = urllib.request.build_opener(_RefuseRedirects)


class WebhookChannel(NotificationChannel):
    """POSTs the payload as JSON with ``Idempotency-Key: <run_id>:<channel>``.

    Only a 2xx answer delivers the row. Redirects are not followed: a 3xx, like any other
    non-2xx answer, a timeout or a dropped connection, is a failed attempt (the status is the
    row's ``last_error``) retried later with the same key, and the ``Authorization`` header
    never leaves the configured URL's origin.
    """

    url: str = Field(description="Receiver URL; put any token in an EnvVar-backed header")
    authorization: str = Field(default="", repr=False, description="Authorization header value")
    timeout_seconds: float = 10.0

    def send(self, row: OutboxRecord) -> None:
        headers = {"Content-Type": "application/json", "Idempotency-Key": row.idempotency_key}
        if self.authorization:
            headers["Authorization"] = self.authorization
        request = urllib.request.Request(  # noqa: S310
            self.url, data=json.dumps(row.payload).encode(), headers=headers, method="POST"
        )
        try:
            with _OPENER.open(request, timeout=self.timeout_seconds) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            where = f" to {exc.headers.get('Location')!r}" if 300 <= exc.code < 400 else ""
            raise ConnectionError(
                f"webhook answered HTTP {exc.code}{where} (redirects are not followed)"
                if where
                else f"webhook answered HTTP {exc.code}"
            ) from None
        if not 200 <= status < 300:
            raise ConnectionError(f"webhook answered HTTP {status}")
