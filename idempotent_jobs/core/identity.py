"""The stable identity of one logical run: the same inputs give the same 64-hex id, everywhere.

The id is ``sha256("job|subject|<UTC start, isoformat seconds>|version")``, byte for byte, so other
tools that follow the published recipe compute the same ids. Text fields are stripped and put in
Unicode normal form C (NFC) first, so "café" typed with a combining accent (NFD) is the same run as
"café" typed precomposed; for ASCII and NFC text this changes nothing, so such ids are exactly the
recipe's. An empty field, a ``|`` or a control character would make the ``|``-joined encoding
ambiguous, so they are refused. ``scheduled_at`` must fall in the years 1900-9000 once in UTC.
"""

import hashlib
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from idempotent_jobs.core.errors import InvalidInputError

MAX_FIELD_LENGTH = 512
MIN_YEAR = 1900
MAX_YEAR = 9000


def normalize_text(value: str) -> str:
    """Stripped and in Unicode NFC: how identity text is compared, stored and hashed."""
    return unicodedata.normalize("NFC", value.strip())


def clean_identity_text(name: str, value: object) -> str:
    """Strip ``value`` and check it can be an identity field; raise naming ``name`` if not."""
    if not isinstance(value, str):
        raise InvalidInputError(name, f"must be a string, got {type(value).__name__}")
    text = normalize_text(value)
    if not text:
        raise InvalidInputError(name, "must not be empty")
    if "|" in text:
        raise InvalidInputError(name, "must not contain '|' (it separates the identity fields)")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in text):
        raise InvalidInputError(
            name, "must not contain control, format or lone surrogate characters"
        )
    if len(text) > MAX_FIELD_LENGTH:
        raise InvalidInputError(name, f"must be at most {MAX_FIELD_LENGTH} characters")
    return text


def _clean_time(value: object) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInputError("scheduled_at", f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            "scheduled_at", "must be timezone-aware (a naive datetime is refused)"
        )
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None  # e.g. 9999-12-31T23:00-05:00, past datetime.max in UTC
    if utc is None or not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise InvalidInputError(
            "scheduled_at", f"must be in the years {MIN_YEAR}-{MAX_YEAR} in UTC, got {value}"
        )
    # The id encodes whole seconds, so the identity keeps whole seconds too: two values that give
    # the same id must be the same identity.
    return utc.replace(microsecond=0)


def _encode_time(value: datetime) -> str:
    return value.isoformat(timespec="seconds")


def run_ids(
    job_name: str, version: str, subject_ids: Sequence[str], starts: Iterable[datetime]
) -> Iterator[tuple[datetime, str, str]]:
    """(window start, subject, run id) of every subject in every window, as :class:`RunIdentity`
    computes each, with each field checked once rather than once per run (an estimate over a
    million partitions)."""
    job = clean_identity_text("job_name", job_name)
    ver = clean_identity_text("version", version)
    subjects = [(s, clean_identity_text("subject_id", s)) for s in subject_ids]
    for start in starts:
        encoded_time = _encode_time(_clean_time(start))
        for subject, clean in subjects:
            encoded = "|".join((job, clean, encoded_time, ver))
            yield start, subject, hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def stable_run_id(job_name: str, subject_id: str, scheduled_at: datetime, version: str) -> str:
    """Return the 64-hex-char id of the logical run; see the module docstring for the recipe."""
    return RunIdentity(job_name, subject_id, scheduled_at, version).run_id


@dataclass(frozen=True)
class RunIdentity:
    """Who, for which window, under which job version: the fields the run id is computed from.

    Construction normalises the fields (stripped text, ``scheduled_at`` in UTC) and refuses bad
    values with an :class:`InvalidInputError` (a ``ValueError``) naming the field.
    """

    job_name: str
    subject_id: str
    scheduled_at: datetime
    version: str
    run_id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        job_name = clean_identity_text("job_name", self.job_name)
        subject_id = clean_identity_text("subject_id", self.subject_id)
        scheduled_at = _clean_time(self.scheduled_at)
        version = clean_identity_text("version", self.version)
        encoded = "|".join((job_name, subject_id, _encode_time(scheduled_at), version))
        object.__setattr__(self, "job_name", job_name)
        object.__setattr__(self, "subject_id", subject_id)
        object.__setattr__(self, "scheduled_at", scheduled_at)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "run_id", hashlib.sha256(encoded.encode("utf-8")).hexdigest())
