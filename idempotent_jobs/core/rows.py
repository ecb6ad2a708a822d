"""Rows into records: how both faces of the ledger turn a statement's rows into dataclasses."""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from psycopg import Cursor
from psycopg.rows import RowMaker, dict_row

Row = TypeVar("Row")


@cache
def _field_names(cls: Callable[..., object]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def record_from(cls: Callable[..., Row], row: Mapping[str, Any]) -> Row:
    """A record from a row's columns, ignoring columns the record has no field for (a
    ``SELECT *`` keeps working when a later migration adds one)."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in row.items() if k in names})


def record_row(cls: Callable[..., Row]) -> Callable[[Cursor[Any]], RowMaker[Row]]:
    """A psycopg row factory building ``cls`` records with :func:`record_from`."""

    def factory(cursor: Cursor[Any]) -> RowMaker[Row]:
        make_dict = dict_row(cursor)

        def make(values: Sequence[Any]) -> Row:
            return record_from(cls, make_dict(values))

        return make

    return factory
