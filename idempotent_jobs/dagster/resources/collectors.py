"""The collector: sample documents shipped with the package (default) or an HTTP/RSS feed."""

import json
import urllib.request
import xml.etree.ElementTree as ET
from abc import ABC
from email.utils import parsedate_to_datetime
from importlib import resources
from typing import Any
from urllib.parse import quote

from pydantic import Field

from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.dagster.resources.steps import Collector


class DocumentCollector(Collector, ABC):
    """A collector of documents: ``{"documents": [...], ...}`` (what the summary models read)."""


class SampleDocumentsCollector(DocumentCollector):
    """Offline: the documents in ``<package>/<subject>.json`` (or ``default.json``) of a Python
    package holding JSON lists of documents."""

    package: str = Field(
        default="idempotent_jobs.location.sample_data",
        description="The package (importable name) whose JSON files hold the documents",
    )

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        folder = resources.files(self.package)
        entry = folder.joinpath(f"{identity.subject_id}.json")
        if not entry.is_file():
            entry = folder.joinpath("default.json")
        documents = json.loads(entry.read_text(encoding="utf-8"))
        return {
            "subject": identity.subject_id,
            "window_start": identity.scheduled_at.isoformat(),
            "documents": documents,
        }


class FeedCollector(DocumentCollector):
    """An RSS 2.0 feed per subject: ``url_template`` with ``{subject}``; items in the window."""

    url_template: str = Field(description="e.g. https://news.example/{subject}/rss.xml")
    window_hours: float = Field(default=24.0, description="Items published this long before")
    timeout_seconds: float = 20.0
    max_items: int = 50

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        url = self.url_template.format(subject=quote(identity.subject_id, safe=""))
        with urllib.request.urlopen(url, timeout=self.timeout_seconds) as answer:  # noqa: S310
            root = ET.fromstring(answer.read())
        start = identity.scheduled_at.timestamp()
        end = start + self.window_hours * 3600
        documents = []
        for item in root.iter("item"):
            published = item.findtext("pubDate")
            if published:
                when = parsedate_to_datetime(published).timestamp()
                if not start <= when < end:
                    continue
            documents.append(
                {
                    "title": (item.findtext("title") or "").strip(),
                    "text": (item.findtext("description") or "").strip(),
                    "link": (item.findtext("link") or "").strip(),
                }
            )
        return {
            "subject": identity.subject_id,
            "window_start": identity.scheduled_at.isoformat(),
            "source": url,
            "documents": documents[: self.max_items],
        }
