"""``idempotent-jobs dev``: the Dagster UI and daemon, wired to the ledger, on this machine."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.dagster.project import project_home, project_root
from idempotent_jobs.operator.dagster_home import PACKAGE_ROOT, prepare_dagster_home
from idempotent_jobs.operator.embedded import ensure_database_url, stop_embedded_postgres


def _workspace_file() -> Path:
    for candidate in (project_root() / "workspace.yaml", PACKAGE_ROOT / "workspace.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("workspace.yaml not found in the working directory or project root")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_dev(host: str = "127.0.0.1", port: int = 3000) -> int:
    """Start PostgreSQL if needed, prepare DAGSTER_HOME, migrate, run ``dagster dev``.

    Ctrl-C (or SIGTERM) stops ``dagster dev`` and the embedded PostgreSQL if this call started
    it; the data stays on disk, so the next start loses nothing.
    """
    pgdata = project_home() / "pgdata"
    embedded_was_running = (pgdata / "postmaster.pid").exists()
    uses_embedded = not os.environ.get(DATABASE_URL_ENV)
    url = ensure_database_url()
    home = prepare_dagster_home()
    applied = RunLedger(url).migrate()
    workspace = _workspace_file()
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "dev", "-w", str(workspace), "-h", host, "-p", str(port)]
    print(f"ledger: {'migrated ' + ', '.join(applied) if applied else 'schema up to date'}")
    print(f"DAGSTER_HOME={home}")
    print(f"Dagster UI: http://{host}:{port}", flush=True)
    # Whatever started us (a shell's background job ignores SIGINT), Ctrl-C and SIGTERM stop
    # us, and dagster dev gets a default SIGINT it can act on.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    process = subprocess.Popen(command, cwd=home, preexec_fn=_default_sigint)
    try:
        return process.wait()
    except KeyboardInterrupt:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return 0
    finally:
        if uses_embedded and not embedded_was_running:
            stop_embedded_postgres(pgdata)
