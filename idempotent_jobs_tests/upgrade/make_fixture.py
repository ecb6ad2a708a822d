"""Make ``ledger_0_1.sql`` and ``ledger_0_1.json``: a ledger written by release 0.1 itself.

    python -m idempotent_jobs_tests.upgrade.make_fixture [--server-url URL]

Checks release 0.1 (commit 9f87439) out into a temporary git worktree, runs build_with_0_1.py with
that checkout first on ``PYTHONPATH`` (the same virtualenv: 0.1 pinned the same Dagster) against
a new database, grants a worker role as the deployment advice of that time said (USAGE on the
schema, SELECT, INSERT, UPDATE, DELETE on its tables), and dumps the ledger schema with
``pg_dump``. The dump is committed; this script is how it was made and how to make it again.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

RELEASE_0_1 = "9f874399bf8bf156c2f02d63bb23691a4bd116c3"
HERE = Path(__file__).resolve().parent
DUMP = HERE / "ledger_0_1.sql"
MADE = HERE / "ledger_0_1.json"
#: The login role a 0.1 deployment gave its workers; the dump's GRANTs name it.
WORKER_ROLE = "ij_release_0_1_worker"
SCHEMA = "idempotent_jobs"

# psql meta-commands newer pg_dump versions write (\restrict, \unrestrict): not SQL.
_META_COMMAND = re.compile(r"^\\[a-z]+.*$", re.MULTILINE)


def create_worker_role(server_url: str) -> None:
    """The 0.1-era worker login role, if the server lacks it (roles are per server)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (WORKER_ROLE,))
        if exists.fetchone() is None:
            try:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(WORKER_ROLE)))
            except psycopg.errors.DuplicateObject:
                pass  # created meanwhile by a parallel test


def dump_sql(text: str) -> str:
    """pg_dump's output as plain SQL statements (meta-commands dropped)."""
    return _META_COMMAND.sub("", text)


def build(server_url: str, repo: Path) -> None:
    database = f"ij_upgrade_build_{uuid.uuid4().hex[:10]}"
    url = make_conninfo(server_url, dbname=database)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    create_worker_role(server_url)
    with tempfile.TemporaryDirectory() as scratch:
        checkout = Path(scratch) / "release-0.1"
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", str(checkout), RELEASE_0_1],
            check=True,
            capture_output=True,
        )
        try:
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            builder = subprocess.run(
                [sys.executable, str(HERE / "build_with_0_1.py"), url, f"{scratch}/subjects.yaml"],
                capture_output=True,
                text=True,
                env=env,
                cwd=scratch,
            )
            if builder.returncode != 0:
                raise SystemExit(f"release 0.1's builder failed:\n{builder.stderr}")
            made = builder.stdout
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "GRANT USAGE ON SCHEMA {schema} TO {role};"
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} "
                        "TO {role}"
                    ).format(schema=sql.Identifier(SCHEMA), role=sql.Identifier(WORKER_ROLE))
                )
            params = conninfo_to_dict(url)
            env = {**os.environ}
            for key, variable in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER")):
                if params.get(key):
                    env[variable] = str(params[key])
            if params.get("password"):
                env["PGPASSWORD"] = str(params["password"])
            dumped = subprocess.run(
                ["pg_dump", "--no-owner", "--column-inserts", "--schema", SCHEMA, database],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(checkout)],
                check=False,
                capture_output=True,
            )
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )
    DUMP.write_text(dump_sql(dumped), encoding="utf-8")
    MADE.write_text(json.dumps(json.loads(made), indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server-url",
        default=os.environ.get("IDEMPOTENT_JOBS_TEST_DATABASE_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres",
    )
    args = parser.parse_args()
    build(args.server_url, HERE.parents[1])
    print(f"wrote {DUMP.name} ({DUMP.stat().st_size} bytes) and {MADE.name}")


if __name__ == "__main__":
    main()
