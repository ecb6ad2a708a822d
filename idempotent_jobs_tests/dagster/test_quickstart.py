"""docs/your-own-job.md, built from its own code blocks in a folder outside the repository.

Every ``file=`` block is written as it is, every ``bash run`` block is run line by line (with
``<run-id>`` filled in) by the package installed as a wheel into a virtualenv of its own, and the
``sql`` block grants a worker role. A real Dagster instance on PostgreSQL (the page's own
``dagster.yaml``) records the runs. Then the ledger and the receiver are checked: one run, one
accepted call and one delivered notification per partition, a revision recomputed and notified
once under the ``:r1`` key, and the user's ``dagster.yaml`` unchanged.
"""

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.helpers import JsonApi
from idempotent_jobs_tests.installed_wheel import CHECKOUT
from idempotent_jobs_tests.ledgers import BothFaces

pytestmark = [pytest.mark.dagster_instance]

DOC = CHECKOUT / "docs" / "your-own-job.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LEADS = [{"id": 1, "note": "asked for a quote today"}, {"id": 2, "note": "just browsing"}]


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, info after it, body) of every fenced block, in order."""
    return [(lang, info.strip(), body) for lang, info, body in BLOCK.findall(text)]


@pytest.fixture
def servers() -> Iterator[tuple[JsonApi, Receiver]]:
    api, receiver = JsonApi(LEADS, "/api/leads"), Receiver()
    try:
        yield api, receiver
    finally:
        api.close()
        receiver.close()


def test_the_quickstart_runs_as_written(
    installed: Path,
    servers: tuple[JsonApi, Receiver],
    fresh_database: str,
    server_url: str,
    tmp_path: Path,
) -> None:
    api, receiver = servers
    project = tmp_path / "leads"
    parts = blocks(DOC.read_text(encoding="utf-8"))
    files = {
        info.removeprefix("file="): body for _, info, body in parts if info.startswith("file=")
    }
    assert set(files) >= {"pyproject.toml", "leads/definitions.py"}
    for name, body in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(body, encoding="utf-8")
    user_yaml = (project / "dagster_home" / "dagster.yaml").read_bytes()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IDEMPOTENT_JOBS_DATABASE_URL": fresh_database,
        "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL": dagster_storage_url(fresh_database),
        "DAGSTER_HOME": str(project / "dagster_home"),
        "LEADS_API_URL": api.url,
        "SALES_WEBHOOK_URL": receiver.url,
    }
    commands = [
        line
        for lang, info, body in parts
        if lang == "bash" and info == "run"
        for line in body.splitlines()
        if line.strip()
    ]
    assert commands[0] == "idempotent-jobs migrate"
    run_id = ""
    for command in commands:
        if "<run-id>" in command:
            with BothFaces(fresh_database) as ledger:
                run_id = ledger.list_runs(job_name="lead-scoring", subject_id="emea")[0].run_id
            command = command.replace("<run-id>", run_id[:12])
        done = subprocess.run(
            shlex.split(command),
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr[-3000:]}"
        if command.startswith("idempotent-jobs migrate"):
            [grant] = [body for lang, _, body in parts if lang == "sql"]
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute("DROP ROLE IF EXISTS leads_worker")
            with psycopg.connect(fresh_database, autocommit=True) as conn:
                conn.execute(grant)
            worker = {
                **env,
                "IDEMPOTENT_JOBS_DATABASE_URL": make_conninfo(fresh_database, user="leads_worker"),
            }
            doctor = subprocess.run(
                ["idempotent-jobs", "doctor"],
                cwd=project,
                env=worker,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            assert "ok: role leads_worker has every privilege workers need" in doctor.stdout

    with BothFaces(fresh_database) as ledger:
        runs = ledger.list_runs(job_name="lead-scoring")
        assert sorted(r.subject_id for r in runs) == ["amer", "emea"]
        for run in runs:
            calls = [c.outcome for c in ledger.model_calls(run.run_id)]
            delivered = [o for o in ledger.outbox(run.run_id) if o.delivered_at is not None]
            revised = run.run_id == run_id
            assert run.status == "completed" and run.revision == (1 if revised else 0)
            assert calls == ["accepted"] * (2 if revised else 1)
            assert len(delivered) == (2 if revised else 1)
            assert receiver.effects[f"{run.run_id}:sales_webhook"] == 1
        assert receiver.effects[f"{run_id}:sales_webhook:r1"] == 1
        assert sum(receiver.effects.values()) == 3
    assert len(api.asked) == 2  # collected once per partition: the revision kept its input
    assert (project / "dagster_home" / "dagster.yaml").read_bytes() == user_yaml
    with psycopg.connect(server_url, autocommit=True) as conn:
        with psycopg.connect(fresh_database, autocommit=True) as db:
            db.execute("DROP OWNED BY leads_worker")
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier("leads_worker")))


def test_the_installed_cli_runs_from_any_folder_given_the_url_and_the_location(
    installed: Path, database: str, tmp_path: Path
) -> None:
    """A pod, a cron job, a CI step: no pyproject.toml or workspace here or above, only the
    database URL and a code location, named each way the CLI takes one."""
    from idempotent_jobs_tests.operator.test_outbox_ownership import DEFINITIONS, TEAMS, plant

    anywhere = tmp_path / "pod"
    (anywhere / "code").mkdir(parents=True)
    (anywhere / "code" / "pod_defs.py").write_text(DEFINITIONS.format(**TEAMS["a"]))
    (anywhere / "workspace-elsewhere.yaml").write_text(
        "load_from:\n  - python_file: {relative_path: code/pod_defs.py}\n"
    )
    receiver = Receiver()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IDEMPOTENT_JOBS_DATABASE_URL": database,
        TEAMS["a"]["variable"]: receiver.url,
    }
    with BothFaces(database) as ledger:
        keys = plant(ledger, TEAMS["a"]["identity"], days=1)
    commands = [
        ({}, ["runs", "list"]),
        ({}, ["-m", "pod_defs", "runs", "list", "--job", "weekly_report"]),
        ({}, ["-f", "code/pod_defs.py", "runs", "list", "--job", "weekly_report"]),
        (
            {"IDEMPOTENT_JOBS_CODE_LOCATION": "pod_defs:defs"},
            ["runs", "list", "--job", "weekly_report"],
        ),
        ({}, ["-w", "workspace-elsewhere.yaml", "outbox", "deliver"]),
        ({"IDEMPOTENT_JOBS_CODE_LOCATION": "pod_defs:defs"}, ["outbox", "deliver"]),
    ]
    for extra, argv in commands:
        done = subprocess.run(
            ["idempotent-jobs", *argv],
            cwd=anywhere,
            env={**env, **extra, "PYTHONPATH": str(anywhere / "code")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr[-3000:]}"
        assert "not inside a Dagster project" not in done.stderr
    assert set(receiver.effects) == set(keys)
    assert sorted(p.name for p in anywhere.iterdir()) == ["code", "workspace-elsewhere.yaml"]
    receiver.close()
