"""``idempotent-jobs dev``: the Dagster UI and daemon, wired to the ledger, on this machine."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

import yaml

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.project_paths import project_home
from idempotent_jobs.operator.dagster_home import prepare_dagster_home
from idempotent_jobs.operator.embedded import ensure_database_url, stop_embedded_postgres
from idempotent_jobs.operator.location_targets import Target, find_targets


def _dagster_dev_target(
    module: str | None, python_file: str | None, attribute: str | None, workspace: str | None
) -> tuple[list[str], Path | None]:
    """``dagster dev``'s target arguments and working directory for the code location the CLI
    would load (checked here first, so a project without one hears it before anything starts):
    a project's own ``[tool.dagster]`` is read by ``dagster dev`` itself in that folder, a
    create-dagster project's locations go in a workspace file named as ``dg`` names them, a
    workspace file is passed on, and ``-m``/``-f``/``$IDEMPOTENT_JOBS_CODE_LOCATION`` become
    ``-m``/``-f`` with ``-a`` and ``-d``."""
    targets = find_targets(
        module=module, python_file=python_file, attribute=attribute, workspace=workspace
    )
    first = targets[0]
    if first.dg_project and not any(t.autoload_defs for t in targets):
        return ["-w", str(_dg_workspace_file(targets))], None
    if first.config_file is not None and first.config_file.name == "pyproject.toml":
        return [], first.config_file.parent
    if first.config_file is not None:
        return ["-w", str(first.config_file)], None
    args = ["-m", first.module] if first.module else ["-f", str(first.python_file)]
    args += ["-a", first.attribute] if first.attribute else []
    args += ["-d", str(first.working_directory)] if first.working_directory else []
    return args, None


def _dg_workspace_file(targets: list[Target]) -> Path:
    """A workspace file for ``dagster dev`` naming each code location of a create-dagster
    project (or dg.toml workspace) as ``dg`` names it (``code_location_name``, by default the
    project's folder), so runs launched by ``idempotent-jobs launch`` show under it."""
    entries = [
        {
            "python_module": {
                "module_name": t.module,
                "working_directory": str(t.working_directory),
                "location_name": t.dagster_location_name,
            }
        }
        for t in targets
    ]
    path = project_home() / "dg-workspace.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"load_from": entries}, sort_keys=False), encoding="utf-8")
    return path


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_dev(
    host: str = "127.0.0.1",
    port: int = 3000,
    *,
    module: str | None = None,
    python_file: str | None = None,
    attribute: str | None = None,
    workspace: str | None = None,
) -> int:
    """Find the code location, start PostgreSQL if needed, use DAGSTER_HOME (the user's as it
    is, else the project's own), migrate, run ``dagster dev`` on that code location.

    Ctrl-C (or SIGTERM) stops ``dagster dev`` and the embedded PostgreSQL if this call started
    it; the data stays on disk, so the next start loses nothing. Any failure before
    ``dagster dev`` starts stops an embedded server this call started, too.
    """
    location, folder = _dagster_dev_target(module, python_file, attribute, workspace)
    pgdata = project_home() / "pgdata"
    embedded_was_running = (pgdata / "postmaster.pid").exists()
    uses_embedded = not os.environ.get(DATABASE_URL_ENV)
    url = ensure_database_url()
    try:
        home = prepare_dagster_home()
        applied = LedgerAdmin(url).migrate()
    except BaseException:
        if uses_embedded and not embedded_was_running:
            stop_embedded_postgres(pgdata)
        raise
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "dev", *location, "-h", host, "-p", str(port)]
    print(f"ledger: {'migrated ' + ', '.join(applied) if applied else 'schema up to date'}")
    print(f"DAGSTER_HOME={home}")
    print(f"Dagster UI: http://{host}:{port}", flush=True)
    # Whatever started us (a shell's background job ignores SIGINT), Ctrl-C and SIGTERM stop
    # us, and dagster dev gets a default SIGINT it can act on.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    process = subprocess.Popen(command, cwd=folder or home, preexec_fn=_default_sigint)
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
