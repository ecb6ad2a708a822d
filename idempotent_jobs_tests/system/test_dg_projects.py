"""The CLI finds a create-dagster project and a dg.toml workspace by itself, as `dg` does, and
loads their definitions as Dagster does: a ``@dg.definitions`` loader over a defs folder holding
the package's component. Projects are written here in create-dagster's layout, outside the
repository (the whole path, with `create-dagster` and `dg` themselves, is test_create_dagster)."""

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.dependency import NodeHandle

from idempotent_jobs import RateLimit
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.cli import main
from idempotent_jobs.operator.code_location import load_workspace
from idempotent_jobs.operator.location_targets import CodeLocationError, find_targets

DEFINITIONS = """\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

STEPS = """\
from idempotent_jobs import ModelAnswer, ModelUsage
from idempotent_jobs.dagster import Collector, ModelStep


class Source(Collector):
    def collect(self, identity):
        return {"subject": identity.subject_id}


class Model(ModelStep):
    @property
    def model_name(self):
        return "template-model"

    def generate(self, raw_input, context):
        return ModelAnswer({"summary": raw_input["subject"]}, ModelUsage(self.model_name, 3, 1))
"""

DEFS_YAML = """\
type: idempotent_jobs.dagster.IdempotentJob
attributes:
  name: {job}
  identity_job_name: {job_id}
  version: v1
  window: {{start: "2026-11-01", every: day}}
  subjects: [north, south]
  collector: {{type: .steps.Source}}
  model_step: {{type: .steps.Model}}
  channels:
    {job}_file: {{type: JsonLinesChannel, config: {{path: {notifications}}}}}
  rate_limits:
    - {{provider: openai, model: gpt-4o-mini, requests_per_minute: 500, tokens_per_minute: 200000}}
"""


def write_project(folder: Path, job: str) -> str:
    """A create-dagster project in ``folder`` with one IdempotentJob component; its module."""
    package = f"dgproj_{uuid.uuid4().hex[:8]}"
    (folder / "src" / package / "defs" / job).mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{folder.name}"\nversion = "0.1.0"\n\n'
        f'[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "{package}"\n'
    )
    source = folder / "src" / package
    (source / "__init__.py").write_text("")
    (source / "definitions.py").write_text(DEFINITIONS)
    (source / "defs" / "__init__.py").write_text("")
    (source / "defs" / job / "steps.py").write_text(STEPS)
    notifications = folder / "notifications.jsonl"
    (source / "defs" / job / "defs.yaml").write_text(
        DEFS_YAML.format(job=job, job_id=job.replace("_", "-"), notifications=notifications)
    )
    return package


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """The projects' packages are imported from their src/ folders: forgotten afterwards."""
    before, path = set(sys.modules), list(sys.path)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("dgproj_"):
            del sys.modules[name]
    sys.path[:] = path


def test_a_create_dagster_project_is_found_and_its_component_loaded(
    tmp_path: Path, clean_modules: None
) -> None:
    project = tmp_path / "churn-alerts"
    package = write_project(project, "churn_alerts")
    inside = project / "src" / package / "defs"
    [target] = find_targets(start=inside)
    assert target.module == f"{package}.definitions"
    assert target.dagster_location_name == "churn-alerts"  # dg's default: the folder's name
    assert target.working_directory == project / "src"
    assert "[tool.dg]" in target.found_in
    workspace = load_workspace(start=inside)
    [spec] = workspace.specs
    assert (spec.name, spec.identity_job_name, spec.version) == (
        "churn_alerts",
        "churn-alerts",
        "v1",
    )
    assert list(spec.subjects) == ["north", "south"]
    assert spec.collector == "churn_alerts_collector" and spec.channels == ("churn_alerts_file",)
    assert list(spec.rate_limits) == [
        RateLimit("openai", "gpt-4o-mini", requests_per_minute=500, tokens_per_minute=200_000)
    ]
    resources = workspace.locations[0].resources
    assert {"ledger", "churn_alerts_collector", "churn_alerts_model"} <= set(resources)


def test_a_dg_workspace_lists_its_projects_and_the_nearest_folder_wins(
    tmp_path: Path, clean_modules: None
) -> None:
    root = tmp_path / "analytics"
    first = write_project(root / "projects" / "alerts", "alerts")
    second = write_project(root / "projects" / "digests", "digests")
    (root / "dg.toml").write_text(
        'directory_type = "workspace"\n\n[workspace]\n\n'
        '[[workspace.projects]]\npath = "projects/alerts"\n\n'
        '[[workspace.projects]]\npath = "projects/digests"\n'
    )
    targets = find_targets(start=root)
    assert [t.module for t in targets] == [f"{first}.definitions", f"{second}.definitions"]
    assert all("dg.toml" in t.found_in for t in targets)
    workspace = load_workspace(start=root)
    assert sorted(s.name for s in workspace.specs) == ["alerts", "digests"]
    # Inside one project, that project alone (as dg does).
    [only] = find_targets(start=root / "projects" / "digests")
    assert only.module == f"{second}.definitions"


def test_a_broken_dg_configuration_is_one_line_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "pyproject.toml").write_text('[tool.dg]\ndirectory_type = "project"\n')
    with pytest.raises(CodeLocationError, match=r"\[tool.dg\] in .*pyproject.toml.*root_module"):
        find_targets(start=folder)
    (folder / "dg.toml").write_text(
        'directory_type = "workspace"\n[workspace]\n[[workspace.projects]]\npath = "nowhere"\n'
    )
    with pytest.raises(CodeLocationError, match=r"dg.toml: workspace.projects\[1\] nowhere"):
        find_targets(start=folder)
    (folder / "dg.toml").write_text('directory_type = "library"\n')
    with pytest.raises(CodeLocationError, match="directory_type must be 'project' or 'workspace'"):
        find_targets(start=folder)


def test_every_command_works_in_a_create_dagster_project(
    tmp_path: Path,
    database: str,
    clean_modules: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = tmp_path / "alerts-project"
    write_project(project, "alerts")
    monkeypatch.chdir(project)
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", database)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    for argv in (
        ["launch", "--wait", "--job", "alerts", "north|2026-11-02", "south|2026-11-02"],
        ["launch", "--wait", "--job", "alerts", "--from", "2026-11-02", "--subject", "north"],
        ["runs", "list", "--job", "alerts"],
        ["outbox", "deliver"],
        ["reconcile", "--job", "alerts"],
        ["estimate", "--job", "alerts", "--from", "2026-11-01", "--to", "2026-11-03"],
    ):
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, f"{argv}\n{out.out}\n{out.err}"
    with LedgerAdmin(database) as operator:
        runs = operator.list_runs(job_name="alerts")
        assert sorted(r.subject_id for r in runs) == ["north", "south"]
        assert all(len(operator.model_calls(r.run_id)) == 1 for r in runs)
    lines = (project / "notifications.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one notification per partition


def test_dev_serves_a_create_dagster_project_under_dgs_location_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`idempotent-jobs dev` hands `dagster dev` a workspace naming each location as `dg` does,
    the name `launch` tags its runs with."""
    import yaml

    from idempotent_jobs.core.project_paths import HOME_ENV
    from idempotent_jobs.operator.dev import _dagster_dev_target

    project = tmp_path / "churn-alerts"
    package = write_project(project, "churn_alerts")
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(project)
    args, folder = _dagster_dev_target(None, None, None, None)
    assert args[0] == "-w" and folder is None
    [entry] = yaml.safe_load(Path(args[1]).read_text())["load_from"]
    assert entry["python_module"] == {
        "module_name": f"{package}.definitions",
        "working_directory": str(project / "src"),
        "location_name": "churn-alerts",
    }
    assert Path(args[1]).parent == project / ".idempotent_jobs"


def test_a_component_on_the_batch_lane_builds_the_batch_job_and_its_sensor(
    tmp_path: Path, clean_modules: None
) -> None:
    project = tmp_path / "ticket-labels"
    package = write_project(project, "ticket_labels")
    defs_yaml = project / "src" / package / "defs" / "ticket_labels" / "defs.yaml"
    text = defs_yaml.read_text()
    defs_yaml.write_text(text + "  lane: batch\n")
    with pytest.raises(CodeLocationError, match=r"lane.*batch API.*not Model"):
        load_workspace(start=project)
    defs_yaml.write_text(
        text.replace(
            "model_step: {type: .steps.Model}",
            "model_step: {type: OpenAICompatibleModel, config: {model: gpt-4o-mini}}",
        )
        + "  lane: batch\n"
    )
    for name in [m for m in sys.modules if m.startswith("dgproj_")]:
        del sys.modules[name]
    workspace = load_workspace(start=project)
    defs = workspace.locations[0].defs
    assert defs.resolve_job_def("ticket_labels_batch").name == "ticket_labels_batch"
    assert defs.resolve_sensor_def("ticket_labels_batches").name == "ticket_labels_batches"
    [spec] = workspace.specs  # the batch job is the spec's, not a second spec
    assert spec.name == "ticket_labels"


TRIAGE_STEPS = """
from pydantic import BaseModel

from idempotent_jobs.models import Prompt


class Triage(BaseModel):
    summary: str
    priority: int


def triage_prompt(raw_input, context):
    return Prompt.of(system=context.instructions, user=str(raw_input))
"""


def test_a_yaml_model_step_resolves_its_folders_references_and_checks_them_when_built(
    tmp_path: Path, clean_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prompt: .steps:triage_prompt`` is the component folder's module, imported when the
    definitions are built (as ``dg check defs`` builds them); a typo names the field there,
    not at the first run. Retry settings reach the model step's op."""
    monkeypatch.setenv("TRIAGE_KEY", "sk-ant-local")
    project = tmp_path / "triage"
    package = write_project(project, "triage")
    folder = project / "src" / package / "defs" / "triage"
    (folder / "steps.py").write_text(STEPS + TRIAGE_STEPS)
    defs_yaml = folder / "defs.yaml"
    model_step = (
        "model_step:\n    type: AnthropicModel\n    config:\n      model: claude-haiku-4-5\n"
        "      api_key: {env: TRIAGE_KEY}\n      base_url: http://127.0.0.1:9/anthropic\n"
        "      prompt: .steps:{prompt}\n      output_schema: .steps.Triage"
    )
    text = defs_yaml.read_text().replace("model_step: {type: .steps.Model}", model_step)
    retry = "  retry: {max_retries: 2, delay_seconds: 5, backoff: linear, jitter: false}\n"
    defs_yaml.write_text(text.replace("{prompt}", "triage_promt") + retry)
    with pytest.raises(CodeLocationError, match=r"model_step\.config\.prompt.*triage_promt"):
        load_workspace(start=project)
    for name in [m for m in sys.modules if m.startswith("dgproj_")]:
        del sys.modules[name]
    defs_yaml.write_text(text.replace("{prompt}", "triage_prompt") + retry)
    workspace = load_workspace(start=project)
    defs = workspace.locations[0].defs
    model = defs.resources["triage_model"]  # type: ignore[index]
    assert model.prompt == f"{package}.defs.triage.steps:triage_prompt"
    assert model.output_schema == f"{package}.defs.triage.steps.Triage"
    schema = model.output_schema_of()
    assert schema is not None and set(schema.json_schema["properties"]) == {"summary", "priority"}
    policy = defs.resolve_job_def("triage").get_retry_policy_for_handle(
        NodeHandle("transform", None)
    )
    assert policy is not None and (policy.max_retries, policy.delay) == (2, 5)
    assert policy.backoff == dg.Backoff.LINEAR and policy.jitter is None


@pytest.mark.parametrize(
    ("attribute", "field"),
    [
        ("lease_seconds: .inf", r"lease_seconds[^;]*: Input should be a finite number"),
        ("retry: {max_retries: -1}", r"retry\.max_retries[^;]*: Value error, is -1, not a"),
        ("lane: bath", r"lane[^;]*: Input should be 'online' or 'batch'"),
        ("subjects: north", r"subjects[^;]*: Input should be a valid list"),
    ],
)
def test_a_components_numbers_are_checked(
    attribute: str, field: str, tmp_path: Path, clean_modules: None
) -> None:
    project = tmp_path / "numbers"
    package = write_project(project, "numbers")
    defs_yaml = project / "src" / package / "defs" / "numbers" / "defs.yaml"
    defs_yaml.write_text(defs_yaml.read_text() + f"  {attribute}\n")
    with pytest.raises(CodeLocationError, match=field):
        load_workspace(start=project)


ALIAS_BOMB = """
  description: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]
""" + "".join(
    f"  d{n}: &a{n} [*a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}, *a{n - 1}]\n"
    for n in range(1, 30)
)


def test_an_alias_bomb_and_an_unknown_setting_are_refused_naming_the_file_and_field(
    tmp_path: Path, clean_modules: None
) -> None:
    project = tmp_path / "bombed"
    package = write_project(project, "bombed")
    defs_yaml = project / "src" / package / "defs" / "bombed" / "defs.yaml"
    text = defs_yaml.read_text()
    defs_yaml.write_text(text + ALIAS_BOMB)
    with pytest.raises(CodeLocationError, match=r"defs\.yaml.*more than 100 aliases"):
        load_workspace(start=project)  # refused before Dagster builds it (it would hang)
    defs_yaml.write_text(
        text.replace(
            "{type: JsonLinesChannel, config: {path:",
            "{type: JsonLinesChannel, config: {pth: x, path:",
        )
    )
    with pytest.raises(
        CodeLocationError, match=r"channels\.bombed_file\.config\.pth.*not a setting"
    ):
        load_workspace(start=project)


def test_a_component_adds_its_reconciliation_and_retention_jobs_with_their_schedules(
    tmp_path: Path, clean_modules: None
) -> None:
    project = tmp_path / "upkeep"
    package = write_project(project, "upkeep")
    defs_yaml = project / "src" / package / "defs" / "upkeep" / "defs.yaml"
    text = defs_yaml.read_text()
    defs_yaml.write_text(
        text + "  retention_days: {raw_input: 30}\n  reconciliation_schedule: '*/10 * * * *'\n"
    )
    defs = load_workspace(start=project).locations[0].defs
    for job, cron in (
        ("upkeep_reconciliation", "*/10 * * * *"),
        ("upkeep_retention", "30 3 * * *"),
    ):
        assert defs.resolve_job_def(job).name == job
        schedule = defs.resolve_schedule_def(f"{job}_schedule")
        assert schedule.cron_schedule == cron
        assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    for name in [m for m in sys.modules if m.startswith("dgproj_")]:
        del sys.modules[name]
    defs_yaml.write_text(text + "  reconciliation_schedule: every hour\n")
    with pytest.raises(CodeLocationError, match=r"reconciliation_schedule.*not a cron schedule"):
        load_workspace(start=project)
