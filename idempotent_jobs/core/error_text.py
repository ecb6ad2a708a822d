"""Text that came from outside (an exception, a receiver's answer) made safe to store and show.

Secrets first: whatever looks like one (an API key by its usual prefix, a bearer or basic
credential, a URL's password, an ``api_key=``/``"password": ...`` setting, or a value the caller
knows is secret) is replaced by ``****`` before any text is stored, logged or put on a span. A
provider or proxy that echoes the key it was sent in its error body never puts it in the ledger.

PostgreSQL's ``text`` refuses NUL, and UTF-8 has no lone surrogates: an error message holding
either would make the very statement that records the failure fail, and the failure would go
unrecorded (the lease held, the model call unpaid for in the books). So such characters are
escaped (``\\x00``, ``\\udc80``), every other control character but tab and newline too, and the
text is capped.
"""

import json
import re
from collections.abc import Iterable

MAX_ERROR_CHARS = 4000
_KEEP = frozenset("\t\n")
#: A known value shorter than this is not looked for (it would match ordinary words).
_MIN_KNOWN_CHARS = 8
_SECRETS = (
    re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"\b(sk|pk|rk|xox[abprs]|ghp|gho|glpat|AKIA)[-_A-Za-z0-9]{8,}"),
    re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^@\s]*@"),
    re.compile(
        r"(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|token|authorization"
        r"|x-api-key)(['\"]?\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,;}]+)"
    ),
)


def redact_secrets(text: str) -> str:
    """``text`` with what looks like a secret replaced by ``****``: bearer and basic
    credentials, API keys by their usual prefixes, URL passwords, ``password=``/``api_key:``
    style settings (quoted JSON keys too)."""
    text = _SECRETS[0].sub(lambda m: f"{m.group(1)} ****", text)
    text = _SECRETS[1].sub("****", text)
    text = _SECRETS[2].sub(lambda m: f"{m.group(1)}****@", text)
    return _SECRETS[3].sub(lambda m: f"{m.group(1)}{m.group(2)}****", text)


def redact_known(text: str, values: Iterable[str], mark: str = "****") -> str:
    """``text`` with each of ``values`` (a key the caller holds, the text it sent) replaced by
    ``mark``, as written and as JSON would escape it; each line of a long value too, so an
    echo of part of a prompt goes with it. Values under 8 characters are left alone."""
    found: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            continue
        for part in (value, *value.splitlines()):
            part = part.strip()
            if len(part) >= _MIN_KNOWN_CHARS:
                found.add(part)
                found.add(json.dumps(part)[1:-1])
                found.add(json.dumps(part, ensure_ascii=False)[1:-1])
    for part in sorted(found, key=len, reverse=True):  # the whole value before its lines
        text = text.replace(part, mark)
    return text


def _escaped(ch: str) -> str:
    """``ch`` itself if printable (surrogates are not), else its Python escape."""
    if ch in _KEEP or ch.isprintable():
        return ch
    return ch.encode("unicode_escape", "backslashreplace").decode("ascii")


def safe_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` with NUL, lone surrogates and other control characters escaped, at most
    ``limit`` characters (a cut one ends with ``...``)."""
    cleaned = text if text.isprintable() else "".join(_escaped(ch) for ch in text)
    if len(cleaned) > limit:
        cleaned = cleaned[: max(0, limit - 3)] + "..."
    return cleaned


def describe_error(exc: BaseException) -> str:
    """The reason stored for a failed attempt: ``Type: message``, secrets redacted, made safe;
    never raises, even for an exception whose ``__str__`` does."""
    name = type(exc).__name__
    try:
        text = redact_secrets(str(exc))
    except Exception:  # a hostile __str__: the type still says what happened
        text = "<message could not be read>"
    return safe_text(f"{name}: {text}" if text else name)
