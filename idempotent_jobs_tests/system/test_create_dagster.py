"""docs/your-own-job.md's create-dagster path, built from its own blocks outside the repository.

``create-dagster`` (at the Dagster version the package pins) makes the project, ``dg`` scaffolds
the package's component into it, the page's ``dg-file=`` blocks replace the template, and every
``bash dg-run`` (in the folder above) and ``bash dg-project`` (in the project) line runs as it
is, with the package installed as a wheel in a virtualenv of its own. Then: ``dg list
components`` shows the type, ``dg check defs`` refuses a wrong field naming it, and the ledger
holds one run, one model call and one webhook post per partition, however often each was
launched, by ``dg`` or by the CLI.
"""

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.helpers import JsonApi
from idempotent_jobs_tests.installed_wheel import CHECKOUT
from idempotent_jobs_tests.ledgers import BothFaces
from idempotent_jobs_tests.system.test_quickstart import blocks

pytestmark = [pytest.mark.dagster_instance]

DOC = CHECKOUT / "docs" / "your-own-job.md"
SECTION = "## The create-dagster path"
ACCOUNTS = [{"id": "a1", "logins": 0}, {"id": "a2", "logins": 9}, {"id": "a3", "logins": 1}]
COMPONENT = "idempotent_jobs.dagster.IdempotentJob"


@pytest.fixture
def servers() -> Iterator[tuple[JsonApi, Receiver]]:
    api, receiver = JsonApi(ACCOUNTS, "/api/accounts"), Receiver()
    try:
        yield api, receiver
    finally:
        api.close()
        receiver.close()


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_create_dagster_path_runs_as_written(
    installed: Path,
    servers: tuple[JsonApi, Receiver],
    fresh_database: str,
    tmp_path: Path,
) -> None:
    api, receiver = servers
    text = DOC.read_text(encoding="utf-8")
    parts = blocks(text[text.index(SECTION) :])
    base = tmp_path / "work"
    base.mkdir()
    project = base / "churn-alerts"
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "VIRTUAL_ENV": str(installed.parent),
        "IDEMPOTENT_JOBS_DATABASE_URL": fresh_database,
        "DAGSTER_HOME": str(home),
        "ACCOUNTS_API_URL": api.url,
        "ALERTS_WEBHOOK_URL": receiver.url,
    }
    ran: list[str] = []
    for lang, info, body in parts:
        if info.startswith("dg-file="):
            target = project / info.removeprefix("dg-file=")
            assert target.is_file(), f"dg scaffold wrote no {target}"  # replaced, not added
            target.write_text(body, encoding="utf-8")
            continue
        if lang != "bash" or info not in ("dg-run", "dg-project"):
            continue
        for line in filter(str.strip, body.splitlines()):
            done = run(line, base if info == "dg-run" else project, env)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr[-3000:]}"
            ran.append(line)
    assert any(line.startswith("dg launch") for line in ran)
    assert any(line.startswith("dg check defs") for line in ran)

    listed = run("dg list components", project, env)
    assert listed.returncode == 0 and COMPONENT in listed.stdout, listed.stdout + listed.stderr

    with BothFaces(fresh_database) as ledger:
        runs = ledger.list_runs(job_name="churn-alerts")
        assert sorted(r.subject_id for r in runs) == ["amer", "emea"]
        for record in runs:
            assert record.status == "completed"
            assert [c.outcome for c in ledger.model_calls(record.run_id)] == ["accepted"]
            assert record.output == {"at_risk": ["a1", "a3"]}
            assert receiver.effects[f"{record.run_id}:alerts_webhook"] == 1
    assert sum(receiver.effects.values()) == 2
    assert len(api.asked) == 2  # collected once per partition

    # A wrong field is refused by `dg check defs`, naming it.
    defs_yaml = project / "src" / "churn_alerts" / "defs" / "churn_alerts" / "defs.yaml"
    good = defs_yaml.read_text(encoding="utf-8")
    defs_yaml.write_text(re.sub(r"\bsubjects:", "subjekts:", good), encoding="utf-8")
    checked = run("dg check defs", project, env)
    assert checked.returncode != 0
    assert "subjekts" in checked.stdout + checked.stderr
    defs_yaml.write_text(good.replace("every: day", "every: fortnight"), encoding="utf-8")
    checked = run("dg check defs", project, env)
    assert checked.returncode != 0 and "fortnight" in checked.stdout + checked.stderr
