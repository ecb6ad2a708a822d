"""A real PgBouncer (Debian's, 1.18 here) in transaction pooling mode in front of a test server.

Used by the concurrency tests, the chaos runner (``--pgbouncer``), the cluster harness and the
capacity benchmark. PgBouncer refuses to run as root: as root it runs as the owner of the
server's socket directory (or ``postgres``/``nobody`` for a TCP server).
"""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from testkit.system_tools import require


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _run_as(server_host: str) -> str | None:
    if os.geteuid() != 0:
        return None
    if server_host.startswith("/"):
        return pwd.getpwuid(os.stat(server_host).st_uid).pw_name
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("no unprivileged user to run PgBouncer as")


class PgBouncer:
    """``PgBouncer(server_url).start()``; :meth:`url` gives a client URL for a database.

    ``ignore_options``: list ``options`` in ``ignore_startup_parameters`` (1.18 refuses a
    client that sends it otherwise; the ledger sends ``-c TimeZone=UTC`` there).
    """

    def __init__(
        self,
        server_url: str,
        *,
        users: tuple[str, ...] = ("postgres",),
        pool_mode: str = "transaction",
        pool_size: int = 20,
        ignore_options: bool = True,
        listen_addr: str = "127.0.0.1",
        port: int | None = None,
        netns: str | None = None,
    ) -> None:
        params: dict[str, Any] = conninfo_to_dict(server_url)
        self.server_host = str(params.get("host") or "127.0.0.1")
        self.server_port = int(params.get("port") or 5432)
        self.users = users
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.ignore_options = ignore_options
        self.listen_addr = listen_addr
        self.port = port or free_port(listen_addr if netns is None else "127.0.0.1")
        self.netns = netns
        self.dir = Path(tempfile.mkdtemp(prefix="ij-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket_dir(self) -> str:
        return str(self.dir)

    def url(self, dbname: str, user: str = "postgres", host: str | None = None) -> str:
        return make_conninfo(
            "", host=host or self.listen_addr, port=self.port, dbname=dbname, user=user
        )

    def config(self) -> str:
        lines = [
            "[databases]",
            f"* = host={self.server_host} port={self.server_port}",
            "[pgbouncer]",
            f"listen_addr = {self.listen_addr}",
            f"listen_port = {self.port}",
            f"unix_socket_dir = {self.dir}",
            "auth_type = trust",
            f"auth_file = {self.dir / 'users.txt'}",
            f"pool_mode = {self.pool_mode}",
            "max_client_conn = 1000",
            f"default_pool_size = {self.pool_size}",
            f"logfile = {self.dir / 'pgbouncer.log'}",
            "admin_users = postgres",
            "server_login_retry = 1",
        ]
        if self.ignore_options:
            lines.append("ignore_startup_parameters = options")
        return "\n".join(lines) + "\n"

    def start(self) -> "PgBouncer":
        binary = require("pgbouncer")["pgbouncer"]
        (self.dir / "users.txt").write_text("".join(f'"{u}" ""\n' for u in self.users))
        (self.dir / "pgbouncer.ini").write_text(self.config())
        command = [binary, str(self.dir / "pgbouncer.ini")]
        user = _run_as(self.server_host)
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            command[1:1] = ["-u", user]
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while not (self.dir / f".s.PGSQL.{self.port}").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PgBouncer did not start: {self.log()[-2000:]}")
            time.sleep(0.02)
        return self

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW what`` on the admin console (over the Unix socket)."""
        admin = make_conninfo(
            "", host=str(self.dir), port=self.port, dbname="pgbouncer", user="postgres"
        )
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute(f"SHOW {what}".encode())
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
