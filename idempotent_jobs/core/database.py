"""Database URLs: parsing, the ledger's libpq conninfo, and keeping passwords out of text."""

import math
import re
from typing import Any
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotent_jobs.core.constants import DATABASE_URL_ENV as DATABASE_URL_ENV  # re-exported
from idempotent_jobs.core.errors import InvalidInputError

# A password in a URL (`scheme://user:PASSWORD@`) or a conninfo string (`password=...`).
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


_KEYWORD_VALUE = re.compile(
    r"password\s*=\s*('(?:[^'\\]|\\.)*'|.*?)(?=\s+[A-Za-z_]+\s*=|$)", re.IGNORECASE | re.DOTALL
)
_QUOTED = re.compile(r'"([^"]*)"')


def _elided(text: str) -> str:
    """libpq's message cut where it first quotes more than one character of the text it
    stumbled on, which may hold the password in any shape (``missing "=" after …``)."""
    for match in _QUOTED.finditer(text):
        if len(match[1]) > 1:
            return text[: match.start()].rstrip() + " …"
    return text


_FRAGMENT_SPLIT = re.compile(r"[\s@%'\"/:?&=#\\]+")


def _passwords_of(url: str) -> set[str]:
    """Every text ``url`` may hold as a password, however malformed ``url`` is: the parsed
    one, and what a person meant (a URL's user info up to its *last* ``@``, so an unencoded
    ``@`` or space stays in it; a keyword's value up to the next ``key=``)."""
    found: set[str] = set()
    try:
        parsed = conninfo_to_dict(libpq_conninfo(url)).get("password")
        if parsed:
            found.add(str(parsed))
    except psycopg.Error:
        pass
    _, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo = rest[: rest.rfind("@")]
        if ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
    for match in _KEYWORD_VALUE.finditer(url):
        value = match[1].strip()
        found.add(value)
        if len(value) >= 2 and value[0] == value[-1] == "'":
            found.add(value[1:-1].replace("\\'", "'").replace("\\\\", "\\"))
    return {f for f in found if f}


def _secret_forms(url: str) -> set[str]:
    """What to hide for ``url``: each password as given, decoded and percent-encoded, every
    piece of it between separators (two characters or more), and every run of four characters
    or more within a piece (libpq echoes the part of a malformed URL it stumbled on)."""
    forms: set[str] = set()
    for password in _passwords_of(url):
        for raw in {password, unquote(password)}:
            forms.update({raw, quote(raw, safe=""), quote(raw)})
            for piece in _FRAGMENT_SPLIT.split(raw):
                if len(piece) >= 2:
                    forms.add(piece)
                ends = range(4, min(len(piece), 256) + 1)
                forms.update(piece[i:j] for j in ends for i in range(0, j - 3))
    return {f for f in forms if f}


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password shown as ``****``: URL and keyword forms, and the password
    of ``url`` (as given, decoded and percent-encoded, and every piece of it two characters or
    longer, since libpq may echo part of a malformed one) wherever it appears."""
    text = _URL_PASSWORD.sub(r"\1****@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1****", text)
    if not url:
        return text
    for secret in sorted(_secret_forms(url), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "****")
    return text


def libpq_conninfo(url: str) -> str:
    """``url`` as libpq (psycopg 3) accepts it: a SQLAlchemy ``+driver`` suffix is dropped."""
    scheme, sep, rest = url.partition("://")
    if sep and "+" in scheme:
        return scheme.split("+", 1)[0] + "://" + rest
    return url


def parse_database_url(url: str) -> dict[str, Any]:
    """The connection parameters of ``url`` (a URL, with or without ``+driver``, or a conninfo
    string); a malformed one raises :class:`InvalidInputError`, password hidden."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError("database_url", "must be a PostgreSQL URL, got nothing")
    try:
        return dict(conninfo_to_dict(libpq_conninfo(url)))
    except psycopg.Error as exc:
        # libpq quotes the part of the text it stumbled on, which may be the password itself
        # in a URL it could not parse as one: every quoted part is dropped, whatever the shape.
        reason = _elided(" ".join(redact(str(exc), url).split()))
        raise InvalidInputError(
            "database_url",
            f"is not a PostgreSQL URL (postgresql://user:…@host:port/dbname) or a "
            f"key=value conninfo string: {reason}",
        ) from None


def connect_timeout_seconds(seconds: float) -> int:
    """libpq's ``connect_timeout`` is whole seconds and 0 means "wait forever": round up, >= 1."""
    return max(1, math.ceil(seconds))


def ledger_conninfo(url: str, connect_timeout: float | None = None) -> str:
    """The conninfo of every ledger connection, from any entry point: the SQLAlchemy driver
    suffix dropped, the session's ``TimeZone`` set to UTC (so a server or role in another zone
    changes no timestamp read), and ``connect_timeout`` in libpq's terms.

    A malformed URL raises :class:`InvalidInputError` naming ``database_url``, password hidden.
    """
    params = parse_database_url(url)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c TimeZone=UTC".strip()
    if connect_timeout is not None:
        params["connect_timeout"] = connect_timeout_seconds(connect_timeout)
    return make_conninfo("", **params)
