"""Turn values bound for a JSONB column into JSON text, or say clearly why they cannot be stored.

Everything stored must be readable back, by every reader, for as long as it is kept. So the
checks happen here, before any write, as an :class:`InvalidInputError` naming the field:
- PostgreSQL's JSONB refuses NaN, infinities and the NUL character (Python's ``json`` would
  write the first two);
- UTF-8 has no lone surrogates, so text holding one cannot be sent at all;
- nesting is limited to :data:`MAX_JSON_DEPTH` levels, a constant that does not depend on how
  deep the caller's stack happens to be: a value stored 990 levels deep would make every later
  read raise ``RecursionError``;
- dict keys become JSON strings, so two keys that become the same string (``1`` and ``"1"``)
  would silently lose one value: refused;
- the JSON text is at most :data:`MAX_JSON_BYTES`.

The text is canonical (keys sorted, no spaces, UTF-8), so :func:`json_fingerprint` of equal values
is equal wherever it is computed.

Reading is guarded the same way: :func:`read_json` (the ledger's JSONB loader) gives a value
nested deeper than :data:`MAX_JSON_DEPTH` (which an earlier release could store) back as an
:class:`UnreadableValue`, whatever the caller's stack, so no list, show or reuse breaks on it.
"""

import hashlib
import json
import math
import re
from itertools import accumulate
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError

MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 100


def _check_text(text: str, field: str) -> None:
    if "\x00" in text:
        raise InvalidInputError(field, "contains a NUL character, which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            field, "contains a lone surrogate character, which is not valid UTF-8"
        ) from None


def _key_text(key: object, field: str) -> str:
    """A dict key as JSON writes it (``json.dumps`` converts these scalar keys to strings)."""
    if isinstance(key, str):
        _check_text(key, field)
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise InvalidInputError(field, f"has a dict key {key!r}, which JSON cannot hold")
        return float.__repr__(key)
    raise InvalidInputError(
        field, f"has a dict key of type {type(key).__name__}; keys must be strings"
    )


def _plain(value: Any, field: str, depth: int) -> Any:
    """A copy of ``value`` made only of JSON types with string keys; raise if it has no such."""
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(field, f"is nested more than {MAX_JSON_DEPTH} levels deep")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        _check_text(value, field)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(field, f"is not storable as JSON: holds {value!r}")
        return value
    if isinstance(value, dict):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            text = _key_text(key, field)
            if text in plain:
                raise InvalidInputError(
                    field, f"has two keys that are both {text!r} as JSON text (e.g. 1 and '1')"
                )
            plain[text] = _plain(item, field, depth + 1)
        return plain
    if isinstance(value, list | tuple):
        return [_plain(item, field, depth + 1) for item in value]
    raise InvalidInputError(field, f"is not JSON-serialisable: holds a {type(value).__name__}")


def canonical_json(value: Any, field: str) -> str:
    """``value`` as canonical JSON text (sorted keys, no spaces), after every check above."""
    text = json.dumps(
        _plain(value, field, 1),
        allow_nan=False,
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    if len(text.encode("utf-8")) > MAX_JSON_BYTES:
        raise InvalidInputError(field, f"is larger than {MAX_JSON_BYTES} bytes as JSON")
    return text


def dump_json_object(value: Any, field: str) -> str:
    """Return ``value`` (a dict) as canonical JSON text for a JSONB column."""
    if not isinstance(value, dict):
        raise InvalidInputError(field, f"must be a JSON object (dict), got {type(value).__name__}")
    return canonical_json(value, field)


def text_fingerprint(text: str) -> str:
    """sha256 (hex) of canonical JSON text made by :func:`canonical_json`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def json_fingerprint(value: Any, field: str = "value") -> str:
    """sha256 (hex) of the canonical JSON of ``value``: equal values, equal fingerprints."""
    return text_fingerprint(canonical_json(value, field))


class UnreadableValue(dict[str, Any]):
    """Stands in for a stored JSON value that cannot be read back safely (too deeply nested).

    A dict, so it flows wherever a stored value does (a reused output, ``--json`` listings), and
    says what it stands for: ``{"unreadable": <reason>, "bytes": <size of the stored text>}``.
    The stored value itself is untouched in the database; ``revise`` replaces it.
    """

    @property
    def reason(self) -> str:
        return str(self["unreadable"])


# A JSON string literal (escapes included) and any run of characters that is not a bracket.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def json_depth(text: bytes) -> int:
    """How deeply the JSON ``text`` nests its arrays and objects (a scalar: 0)."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", text))
    if not brackets:
        return 0
    opening = b"[{"
    return max(accumulate(1 if byte in opening else -1 for byte in brackets))


def read_json(data: bytes | str) -> Any:
    """``json.loads``, but a value nested over :data:`MAX_JSON_DEPTH` levels comes back as an
    :class:`UnreadableValue`. Counting brackets is a C-speed scan, so a value with at most
    that many opening brackets (nearly all) costs nothing more."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        depth = json_depth(raw)
        if depth > MAX_JSON_DEPTH:
            return UnreadableValue(
                unreadable=f"nested more than {MAX_JSON_DEPTH} levels deep ({depth}); "
                "stored by an earlier release",
                bytes=len(raw),
            )
    return json.loads(raw)
