"""A pooler is found on every new connection, not only when the ledger opens.

A two-host URL names the server directly first (here through a plain TCP forwarder, which
keeps the backend's process id, as a direct connection does) and PgBouncer in
transaction mode second. The ledger opens on the direct host and prepares statements; then the
direct host goes away and the pool fails over to PgBouncer. Its new connections must prepare
nothing (PgBouncer 1.18 would answer ``DuplicatePreparedStatement`` or run another client's
statement) and keep UTC.
"""

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.pgbouncer import PgBouncer


class Forwarder:
    """A TCP port on 127.0.0.1 forwarding each connection to the PostgreSQL server of
    ``conninfo`` (TCP or Unix socket): to the client, a direct host (the backend's process id
    is kept). :meth:`close` takes the host away, connections and all.

    Once closed, the port stays bound to a socket that does not listen, so a new connection is
    refused at once, as by a host that went away, and no other test process (the suite runs on
    two) can bind the freed port and make every new pool connection wait for a stranger.
    """

    def __init__(self, conninfo: str) -> None:
        params = conninfo_to_dict(conninfo)
        host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
        self.target: tuple[int, object] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = int(self.listener.getsockname()[1])
        self.tombstone: socket.socket | None = None
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(self.target[0], socket.SOCK_STREAM)
            with self.lock:  # close() either sees this pair or runs before it is kept
                if self.closed:
                    client.close()
                    server.close()
                    return
                server.connect(self.target[1])  # type: ignore[arg-type]
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            try:  # wakes the thread blocked in accept(): close() alone may leave it accepting
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.tombstone = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.tombstone.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.tombstone.bind(("127.0.0.1", self.port))  # bound, never listening: refused
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def release(self) -> None:
        if self.tombstone is not None:
            self.tombstone.close()


REPETITIONS = 20
RUNS_AFTER = 50


def fail_over_once(database: str, pgbouncer: PgBouncer, repetition: int) -> list[str]:
    """One ledger opened on a direct host, 4 runs, the host gone, 50 runs on 4 threads
    through PgBouncer; returns every run's failure."""
    dbname = str(conninfo_to_dict(database)["dbname"])
    user = str(conninfo_to_dict(database).get("user") or "postgres")
    forwarder = Forwarder(database)
    url = make_conninfo(
        "",
        host="127.0.0.1,127.0.0.1",
        port=f"{forwarder.port},{pgbouncer.port}",
        dbname=dbname,
        user=user,
    )
    errors: list[str] = []
    try:
        with HarnessLedger(url, pool_min_size=2, pool_max_size=4, connection_retries=3) as ledger:
            assert not ledger.pooled  # opened on the direct host: statements prepared
            for hour in range(4):
                _, lease = ledger.begin(identity(f"r{repetition}-before", hour), "w", 30)
                assert lease is not None
                ledger.complete(ledger.checkpoint(lease, {"n": hour}), {"summary": "s"})
            forwarder.close()  # the direct host goes away; new connections reach PgBouncer
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", forwarder.port)).close()

            def one_run(number: int) -> None:
                ident = identity(f"r{repetition}-after-{number % 8}", number // 8)
                try:
                    record, lease = ledger.begin(ident, f"w{number}", 30)
                    assert lease is not None
                    assert record.created_at.utcoffset() == timedelta(0)
                    lease = ledger.checkpoint(lease, {"n": number})
                    ledger.complete(lease, {"summary": f"s{number}"})
                except Exception as exc:  # every failure is collected: there must be none
                    errors.append(f"{type(exc).__name__}: {exc}")

            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(one_run, range(RUNS_AFTER)))
            assert ledger.pooled  # the new connections said so
    finally:
        forwarder.release()
    return errors


@pytest.mark.slow
def test_a_failover_from_a_tcp_host_to_pgbouncer_prepares_nothing_and_holds_no_lease(
    database: str, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """20 failovers in a row, each on a ledger of its own: every run completes, no lease is
    left held, and the pool never failed to make a connection (its log says why when it does:
    ``prepared statement "_pg3_0" already exists`` was the check of a new connection, prepared
    on a server connection PgBouncer shares between clients)."""
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    for repetition in range(REPETITIONS):
        errors = fail_over_once(database, pgbouncer, repetition)
        assert errors == [], f"repetition {repetition}: {errors[:3]}"
        refused = [r.getMessage() for r in caplog.records if "error connecting" in r.getMessage()]
        assert refused == [], f"repetition {repetition}: {refused[:3]}"
    with psycopg.connect(database, autocommit=True) as db:
        held = db.execute(
            "SELECT count(*) FROM idempotent_jobs.runs WHERE lease_owner IS NOT NULL"
        ).fetchone()
        done = db.execute(
            "SELECT count(*) FROM idempotent_jobs.runs WHERE status = 'completed'"
        ).fetchone()
    assert held == (0,) and done == (REPETITIONS * (4 + RUNS_AFTER),)
