"""The ledger's SQL: each face's named statements, loaded once per process.

``worker.sql`` holds the worker face's (:class:`~idempotent_jobs.core.ledger.RunLedger`),
``admin.sql`` the operator face's (:class:`~idempotent_jobs.core.admin.LedgerAdmin`); an executor
renders only its own face's, so neither face can run the other's statements.

Each statement in the file starts with ``-- name: <name>`` and a one-line purpose (more comment
lines may follow); the statement runs to the next ``-- name:``. The text is a package file, never
built from input, so each statement is typed as a ``LiteralString``: only its ``{schema}``
placeholder is filled in, with a quoted identifier, and every value is a parameter.
"""

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, LiteralString, cast

#: The two faces of the ledger, each with its own statement file.
Face = Literal["worker", "admin"]
FACES: tuple[Face, ...] = ("worker", "admin")

_NAME = re.compile(r"--\s*name:\s*([a-z_]+)\s*")


@dataclass(frozen=True)
class Statement:
    """One named statement: what it guarantees, in a line, and its text."""

    name: str
    purpose: str
    text: LiteralString


def parse_statements(source: str) -> dict[str, Statement]:
    """The statements of a file in the format above; raise ``ValueError`` on a malformed one."""
    statements: dict[str, Statement] = {}
    name: str | None = None
    comments: list[str] = []
    body: list[str] = []

    def finish() -> None:
        if name is None:
            return
        # Indentation is for the reader of the file: dropped, the statement stays within
        # psycopg's query cache (no string literal spans lines, so no literal changes).
        text = "\n".join(line.strip() for line in body).strip().rstrip(";").strip()
        if not comments or not comments[0]:
            raise ValueError(f"statement {name!r} has no one-line purpose under its name")
        if not text:
            raise ValueError(f"statement {name!r} is empty")
        if name in statements:
            raise ValueError(f"statement {name!r} is defined twice")
        # mypy treats LiteralString as str; the cast states what the text is (a package file).
        literal = cast(LiteralString, text)  # type: ignore[redundant-cast]
        statements[name] = Statement(name, comments[0], literal)

    for line in source.splitlines():
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
def face_statements(face: Face) -> dict[str, Statement]:
    """The statements of one face by name, read from the package once per process."""
    if face not in FACES:
        raise ValueError(f"no ledger face {face!r} (faces: {', '.join(FACES)})")
    source = resources.files(__name__).joinpath(f"{face}.sql").read_text(encoding="utf-8")
    return parse_statements(source)


def statement(face: Face, name: str) -> LiteralString:
    """The text of one of ``face``'s statements; ``KeyError`` names one the face does not
    have (another face's statement included)."""
    try:
        return face_statements(face)[name].text
    except KeyError:
        raise KeyError(f"the {face} face has no statement {name!r}") from None
