"""What both faces of the ledger share: their settings, their executor and its pool, and how they
are opened and closed. A face runs only its own statements (``sql/<face>.sql``); its executor is
private to it."""

import threading
from collections.abc import Callable
from typing import Any, ClassVar, Concatenate, Generic, NoReturn, ParamSpec, Self, TypeVar, overload

from psycopg_pool import ConnectionPool

from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.sql import Face
from idempotent_jobs.core.stores import Stores
from idempotent_jobs.core.this_process import fork_generation

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class StoreMethod(Generic[S, P, R]):
    """A face's method that is one of its stores' (see :func:`of_store`), typed as the store's.
    Asked of the face's class, it is the store's function (its signature and docstring)."""

    def __init__(self, store: str, method: Callable[Concatenate[S, P], R]) -> None:
        self.store = store
        self.function = method
        self.method = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, face: None, owner: type) -> Callable[Concatenate[S, P], R]: ...

    @overload
    def __get__(self, face: "LedgerFace", owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, face: "LedgerFace | None", owner: type | None = None) -> Any:
        if face is None:
            return self.function
        return getattr(getattr(face._stores, self.store), self.method)


def of_store(store: str, method: Callable[Concatenate[S, P], R]) -> StoreMethod[S, P, R]:
    """``begin = of_store("runs", RunsStore.begin)``: the face's ``begin`` is its runs store's,
    with the same signature for callers and for ``mypy``."""
    return StoreMethod(store, method)


class MovedMethod:
    """A method a face no longer has: a typed stub that says what replaced it.

    Asked for, on the class or an instance, it raises ``AttributeError`` with that reason, so
    ``hasattr`` is false. A face has no ``__getattr__``: ``mypy --strict`` refuses a name no
    face defines, and a stub is typed ``NoReturn``.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.name = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = f"{owner.__name__}.{name}"

    def __get__(self, instance: object, owner: type | None = None) -> NoReturn:
        raise AttributeError(f"{self.name} {self.reason}")


def operator_method(name: str) -> MovedMethod:
    """A worker face's stub for a method the operator face has (release 0.1 had it on the
    worker face)."""
    return MovedMethod(
        f"is the operator's now: call it on the operator face, "
        f"LedgerAdmin.beside(ledger).{name}(...) or LedgerAdmin(url).{name}(...)"
    )


class LedgerFace:
    """One face of a ledger: ``Face(settings)`` or ``Face(conninfo, **settings)`` (see
    :class:`LedgerSettings`; the conninfo may hold a password: it is never shown).

    The pool opens on first use (``close()`` or a ``with`` block closes it), or pass ``pool=`` a
    psycopg ``ConnectionPool`` of autocommit connections that you open and close. Opening
    verifies the schema and never runs DDL (``LedgerAdmin.migrate`` does, once per database).
    """

    face: ClassVar[Face]
    executor_class: ClassVar[type[Executor]] = Executor  # how statements run (a benchmark counts)

    def __init__(
        self,
        settings: LedgerSettings | str,
        *,
        pool: ConnectionPool | None = None,
        **options: Any,
    ) -> None:
        self.settings = LedgerSettings.of(settings, **options)
        self._db = self.executor_class(self.settings, self.face, pool=pool)
        self._stores = Stores.over(self._db, self.settings)
        self._local_generation = fork_generation()
        self._local_lock = threading.Lock()
        self._local: dict[str, Any] = {}

    def __repr__(self) -> str:  # the conninfo may hold a password: never shown
        return f"{type(self).__name__}(schema={self.schema!r})"

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the ledger's tables."""
        return self.settings.schema

    @property
    def pooled(self) -> bool:
        """Whether a connection pooler (PgBouncer) was found between this face and PostgreSQL."""
        return self._db.pooled

    def process_local(self, key: str, make: Callable[[], T]) -> T:
        """This face's ``key`` object in this process (``make()`` the first time): what lives
        as long as the face and must not cross a fork (a thread, a lock), such as the lease
        renewer. A forked child starts with none (the parent's threads did not follow it)."""
        if self._local_generation != fork_generation():  # forked: the parent's lock may be held
            self._local_generation, self._local_lock = fork_generation(), threading.Lock()
            self._local = {}
        with self._local_lock:
            if key not in self._local:
                self._local[key] = make()
            value: T = self._local[key]
            return value

    def open(self) -> None:
        """Verify the schema and open the connection pool; a no-op when already open."""
        self._db.open()

    def close(self) -> None:
        """Close the pool this face opened (it can be opened again)."""
        self._db.close()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
