"""The ledger's SQL: one file per store, each face's named statements loaded once per process.

A store is one subsystem of the ledger (``runs``, ``attempts``, ``calls``, ``budgets``,
``prices``, ``limits``, ``outbox``, ``batches``, ``drills``, ``step_outputs``, ``revisions``,
``retention``, ``shadows``: :data:`STORES`) and its file, ``<store>.sql``, holds every
statement of it, once.
A ``-- faces: worker``, ``-- faces: admin`` or ``-- faces: worker admin`` line says which face
may run the statements after it: the worker face
(:class:`~idempotent_jobs.core.ledger.RunLedger`) or the operator face
(:class:`~idempotent_jobs.core.admin.LedgerAdmin`). An executor renders only its own face's, so
neither face can run the other's statements, and a read both faces need is written once.

Each statement starts with ``-- name: <name>`` and a one-line purpose (more comment lines may
follow); the statement runs to the next ``-- name:`` or ``-- faces:``. The text is a package file,
never built from input, so each statement is typed as a ``LiteralString``: only its ``{schema}``
placeholder is filled in, with a quoted identifier, and every value is a parameter.
"""

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, LiteralString, cast

#: The two faces of the ledger.
Face = Literal["worker", "admin"]
FACES: tuple[Face, ...] = ("worker", "admin")

#: The ledger's stores, each with its statement file ``<store>.sql``.
STORES = (
    "runs",
    "attempts",
    "revisions",
    "calls",
    "budgets",
    "prices",
    "limits",
    "outbox",
    "batches",
    "drills",
    "step_outputs",
    "retention",
    "shadows",
)

_NAME = re.compile(r"--\s*name:\s*([a-z_]+)\s*")
_FACES = re.compile(r"--\s*faces:\s*([a-z ]+?)\s*")
_PLACEHOLDER = re.compile(r"%\(([A-Za-z_][A-Za-z0-9_]*)\)s|%%|%")


@dataclass(frozen=True)
class Statement:
    """One named statement: what it guarantees, in a line, and its text."""

    name: str
    purpose: str
    text: LiteralString
    #: The faces that may run it (every face, in a file with no ``-- faces:`` line).
    faces: frozenset[Face] = frozenset(FACES)
    #: The store whose file holds it (empty for a file outside the package's stores).
    store: str = ""


def _faces(line: str, listed: str) -> frozenset[Face]:
    faces = frozenset(listed.split())
    unknown = faces - set(FACES)
    if not faces or unknown:
        raise ValueError(f"{line!r} names no face of {FACES}")
    return cast(frozenset[Face], faces)


def parse_statements(source: str, store: str = "") -> dict[str, Statement]:
    """The statements of a file in the format above; raise ``ValueError`` on a malformed one."""
    statements: dict[str, Statement] = {}
    name: str | None = None
    comments: list[str] = []
    body: list[str] = []
    faces: frozenset[Face] = frozenset(FACES)

    def finish() -> None:
        if name is None:
            return
        # Indentation is for the reader of the file: dropped, fewer bytes to send and parse
        # (no string literal spans lines, so no literal changes).
        text = "\n".join(line.strip() for line in body).strip().rstrip(";").strip()
        if not comments or not comments[0]:
            raise ValueError(f"statement {name!r} has no one-line purpose under its name")
        if not text:
            raise ValueError(f"statement {name!r} is empty")
        if name in statements:
            raise ValueError(f"statement {name!r} is defined twice")
        # mypy treats LiteralString as str; the cast states what the text is (a package file).
        literal = cast(LiteralString, text)  # type: ignore[redundant-cast]
        statements[name] = Statement(name, comments[0], literal, faces, store)

    for line in source.splitlines():
        listed = _FACES.fullmatch(line.strip())
        if listed:
            finish()
            name, faces = None, _faces(line, listed[1])
            continue
        match = _NAME.fullmatch(line.strip())
        if match:
            finish()
            name, comments, body = match[1], [], []
        elif name is not None and not body and line.startswith("--"):
            comments.append(line[2:].strip())
        elif name is not None and (body or line.strip()):
            body.append(line.rstrip())
    finish()
    return statements


@cache
def store_statements() -> dict[str, Statement]:
    """Every store's statements by name, read from the package once per process; a name two
    files define is a ``ValueError`` (a statement is written once)."""
    statements: dict[str, Statement] = {}
    for store in STORES:
        source = resources.files(__name__).joinpath(f"{store}.sql").read_text(encoding="utf-8")
        for name, parsed in parse_statements(source, store).items():
            if name in statements:
                raise ValueError(
                    f"statement {name!r} is defined in {statements[name].store}.sql and {store}.sql"
                )
            statements[name] = parsed
    return statements


@cache
def face_statements(face: Face) -> dict[str, Statement]:
    """The statements one face may run, by name."""
    if face not in FACES:
        raise ValueError(f"no ledger face {face!r} (faces: {', '.join(FACES)})")
    return {name: s for name, s in store_statements().items() if face in s.faces}


def statement(face: Face, name: str) -> LiteralString:
    """The text of one of ``face``'s statements; ``KeyError`` names one the face does not
    have (another face's statement included)."""
    try:
        return face_statements(face)[name].text
    except KeyError:
        raise KeyError(f"the {face} face has no statement {name!r}") from None


def positional(query: str) -> tuple[LiteralString, tuple[str, ...]]:
    """``query``'s ``%(name)s`` placeholders numbered in PostgreSQL's own form (``$1``, ``$2``,
    ...; a name used twice keeps its number) and ``%%`` made ``%``, with the names in number
    order.

    psycopg's ``RawCursor`` sends this form as it is. A named query is parsed by psycopg at
    every execute instead, unless it is under 4,096 bytes (its cache's limit): a statement
    written out whole (``begin``, ``complete``) would cost its parsing on every call, about
    190 us of CPU here. A lone ``%`` is a ``ValueError``, as psycopg makes it."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[0] == "%%":
            return "%"
        if match[1] is None:
            raise ValueError(f"a % that is no %(name)s placeholder in: {query[:80]!r}")
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = _PLACEHOLDER.sub(number, query)
    # A package statement, its placeholders numbered: a literal in all but type.
    return cast(LiteralString, text), tuple(names)  # type: ignore[redundant-cast]
