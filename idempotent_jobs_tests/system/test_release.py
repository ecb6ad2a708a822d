"""A release as users and upgrade tests see it: one version in the package, the CLI and the
CHANGELOG, a release commit named per section, and a wheel and an sdist that `twine check`
passes, with the metadata an index shows."""

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import idempotent_jobs
from idempotent_jobs.operator.cli import main
from idempotent_jobs_tests.installed_wheel import CHECKOUT

#: A release's section: its version and date, or "unreleased" for the one being made (the
#: package then has that version with a ``.devN`` suffix).
SECTION = re.compile(
    r"^## (\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d|unreleased)\)\n(.*?)(?=^## |\Z)", re.M | re.S
)
RELEASE_COMMIT = re.compile(r"^Release commit: `([0-9a-f]{40})`", re.M)


def project() -> dict[str, object]:
    config = tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))
    table = config["project"]
    assert isinstance(table, dict)
    return table


def test_one_version_in_the_package_the_cli_and_the_changelog(
    capsys: pytest.CaptureFixture[str],
) -> None:
    version = project()["version"]
    assert idempotent_jobs.__version__ == version
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"idempotent-jobs {version}"
    sections = SECTION.findall((CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8"))
    newest, dated, _ = sections[0]
    assert isinstance(version, str)
    if dated == "unreleased":
        assert re.fullmatch(rf"{re.escape(newest)}\.dev\d+", version), (version, newest)
    else:
        assert newest == version, "the newest CHANGELOG section is this version's"
    assert all(d != "unreleased" for _, d, _ in sections[1:]), "only the newest is unreleased"
    assert [v for v, _, _ in sections] == sorted(
        (v for v, _, _ in sections), key=lambda v: tuple(map(int, v.split("."))), reverse=True
    )


def test_each_earlier_release_names_its_commit_and_that_commit_is_that_release() -> None:
    sections = SECTION.findall((CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8"))
    named = {v: RELEASE_COMMIT.search(body) for v, _, body in sections}
    assert all(named[v] for v, _, _ in sections[1:]), "every earlier release names its commit"
    for version, found in named.items():
        if found is None:  # the release being made: named when it is cut
            continue
        shown = subprocess.run(
            ["git", "-C", str(CHECKOUT), "show", f"{found[1]}:pyproject.toml"],
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0, f"release commit {found[1]} of {version}: {shown.stderr}"
        assert f'\nversion = "{version}"\n' in shown.stdout


@pytest.mark.slow
def test_the_wheel_and_the_sdist_pass_twine_check_with_their_metadata(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path)] + [str(CHECKOUT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = tmp_path.glob("idempotent_jobs-*.whl")
    [sdist] = tmp_path.glob("idempotent_jobs-*.tar.gz")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    version = project()["version"]
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"idempotent_jobs-{version}.dist-info/METADATA").decode()
        entry_points = archive.read(f"idempotent_jobs-{version}.dist-info/entry_points.txt")
    assert f"Version: {version}\n" in metadata
    assert "License-Expression: Apache-2.0\n" in metadata
    assert "Classifier: Programming Language :: Python :: 3.11\n" in metadata
    for extra in ("dagster", "embedded", "dg", "openai", "otel", "k8s"):
        assert f"Provides-Extra: {extra}\n" in metadata
    assert "Description-Content-Type: text/markdown" in metadata
    assert b"[dagster_dg_cli.registry_modules]\nidempotent_jobs = idempotent_jobs.dagster" in (
        entry_points
    )
