"""Database URLs: parsing, the ledger's libpq conninfo, and keeping passwords out of text."""

import math
import re
from typing import Any
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotent_jobs.core.errors import InvalidInputError

DATABASE_URL_ENV = "IDEMPOTENT_JOBS_DATABASE_URL"


# A password in a URL (`scheme://user:PASSWORD@`) or a conninfo string (`password=...`).
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _password_of(url: str) -> str | None:
    try:
        password = conninfo_to_dict(libpq_conninfo(url)).get("password")
    except psycopg.Error:
        match = re.search(r"://[^:/@\s]*:([^@\s]*)@", url)
        password = unquote(match[1]) if match else None
    return str(password) if password else None


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password shown as ``****``: URL and keyword forms, and the password
    of ``url`` (as given and percent-encoded) wherever it appears."""
    text = _URL_PASSWORD.sub(r"\1****@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1****", text)
    password = _password_of(url) if url else None
    if password:
        for form in {password, quote(password, safe=""), quote(password)}:
            text = text.replace(form, "****")
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
        reason = " ".join(redact(str(exc), url).split())
        raise InvalidInputError(
            "database_url", f"is not a PostgreSQL URL or conninfo string: {reason}"
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
