"""A pooler is found on every new connection, not only when the ledger opens.

A two-host URL names the server directly first (here through a plain forwarder on a Unix
socket, which keeps the backend's process id, as a direct connection does) and PgBouncer in
transaction mode second. The ledger opens on the direct host and prepares statements; then the
direct host goes away and the pool fails over to PgBouncer. Its new connections must prepare
nothing (PgBouncer 1.18 would answer ``DuplicatePreparedStatement`` or run another client's
statement) and keep UTC.
"""

import socket
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import BothFaces
from testkit.pgbouncer import PgBouncer


class Forwarder:
    """A Unix socket forwarding each connection to the PostgreSQL server of ``conninfo`` (TCP or
    Unix socket); :meth:`close` takes the host away, connections and all.

    A socket file in a folder of its own rather than a TCP port: once closed, the host is gone
    for good. A freed TCP port could be bound again by another test process (the suite runs on
    two), and every new pool connection, which tries this host first, would then reach a stranger
    and wait its connect timeout instead of being refused at once.
    """

    def __init__(self, conninfo: str, folder: Path) -> None:
        params = conninfo_to_dict(conninfo)
        host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
        self.target: tuple[int, object] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.folder, self.port = str(folder), 5432
        self.path = folder / f".s.PGSQL.{self.port}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen()
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
            self.path.unlink()  # new connections find no socket: refused at once
            try:  # wakes the thread blocked in accept(): close() alone may leave it accepting
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@pytest.mark.slow
def test_a_failover_to_pgbouncer_prepares_nothing_and_holds_no_lease(
    server_url: str, database: str, pgbouncer: PgBouncer
) -> None:
    dbname = str(conninfo_to_dict(database)["dbname"])
    user = str(conninfo_to_dict(database).get("user") or "postgres")
    folder = Path(tempfile.mkdtemp(prefix="ij-fwd-"))  # short: a socket path has 107 bytes
    forwarder = Forwarder(database, folder)
    url = make_conninfo(
        "",
        host=f"{forwarder.folder},127.0.0.1",
        port=f"{forwarder.port},{pgbouncer.port}",
        dbname=dbname,
        user=user,
    )
    errors: list[str] = []
    with BothFaces(url, pool_min_size=2, pool_max_size=4, connection_retries=3) as ledger:
        assert not ledger.pooled  # opened on the direct host: statements prepared
        for hour in range(4):
            _, lease = ledger.begin(identity("before", hour), "w", 30)
            assert lease is not None
            ledger.complete(ledger.checkpoint(lease, {"n": hour}), {"summary": "s"})
        forwarder.close()  # the direct host goes away; new connections reach PgBouncer
        with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(forwarder.path))

        def one_run(number: int) -> None:
            ident = identity(f"after-{number % 8}", number // 8)
            try:
                record, lease = ledger.begin(ident, f"w{number}", 30)
                assert lease is not None
                assert record.created_at.utcoffset() == timedelta(0)
                lease = ledger.checkpoint(lease, {"n": number})
                ledger.complete(lease, {"summary": f"s{number}"})
            except Exception as exc:  # every failure is collected: there must be none
                errors.append(f"{type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one_run, range(80)))
        assert errors == []
        assert ledger.pooled  # the new connections said so
    folder.rmdir()
    with psycopg.connect(database, autocommit=True) as db:
        held = db.execute(
            "SELECT count(*) FROM idempotent_jobs.runs WHERE lease_owner IS NOT NULL"
        ).fetchone()
        done = db.execute(
            "SELECT count(*) FROM idempotent_jobs.runs WHERE status = 'completed'"
        ).fetchone()
    assert held == (0,) and done == (84,)
