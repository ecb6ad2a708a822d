"""Text that came from outside (an exception, a receiver's answer) made safe to store and show.

PostgreSQL's ``text`` refuses NUL, and UTF-8 has no lone surrogates: an error message holding
either would make the very statement that records the failure fail, and the failure would go
unrecorded (the lease held, the model call unpaid for in the books). So such characters are
escaped (``\\x00``, ``\\udc80``), every other control character but tab and newline too, and the
text is capped.
"""

MAX_ERROR_CHARS = 4000
_KEEP = frozenset("\t\n")


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
    """The reason stored for a failed attempt: ``Type: message``, made safe; never raises, even
    for an exception whose ``__str__`` does."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # a hostile __str__: the type still says what happened
        text = "<message could not be read>"
    return safe_text(f"{name}: {text}" if text else name)
