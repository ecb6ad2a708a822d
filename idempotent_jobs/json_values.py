"""Turn values bound for a JSONB column into JSON text, or say clearly why they cannot be stored.

PostgreSQL's JSONB refuses NaN and infinities and the NUL character; Python's ``json`` would
happily write the first two. Checking here gives the caller a typed error naming the field
instead of a database error after the fact.
"""

import json
from typing import Any

from idempotent_jobs.errors import InvalidInputError

MAX_JSON_BYTES = 64 * 1024 * 1024


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_contains_nul(v) for v in value)
    return False


def dump_json_object(value: Any, field: str) -> str:
    """Return ``value`` (a dict) as compact JSON text for a JSONB column."""
    if not isinstance(value, dict):
        raise InvalidInputError(field, f"must be a JSON object (dict), got {type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except ValueError as exc:  # NaN/Infinity, circular references
        raise InvalidInputError(field, f"is not storable as JSON: {exc}") from None
    except TypeError as exc:  # bytes, sets, datetimes, arbitrary objects
        raise InvalidInputError(field, f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidInputError(field, "is nested too deeply to serialise") from None
    if "\\u0000" in text and _contains_nul(value):
        raise InvalidInputError(field, "contains a NUL character, which PostgreSQL cannot store")
    if len(text.encode("utf-8")) > MAX_JSON_BYTES:
        raise InvalidInputError(field, f"is larger than {MAX_JSON_BYTES} bytes as JSON")
    return text
