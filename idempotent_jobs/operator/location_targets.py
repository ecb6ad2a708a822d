"""Find the user's Dagster code location, the way Dagster's own CLI does (loading it is
:mod:`idempotent_jobs.operator.code_location`'s).

Where the definitions come from, first match wins:

1. the command line: ``-m/--module-name``, ``-f/--python-file`` (each with ``-a/--attribute``),
   or ``-w/--workspace`` (a ``workspace.yaml``);
2. ``$IDEMPOTENT_JOBS_CODE_LOCATION``: ``module[:attribute]``;
3. the project the command runs in: the nearest folder at or above the working directory with
   a ``pyproject.toml`` holding ``[tool.dagster]`` (``module_name``, ``attribute``,
   ``working_directory``), else a ``dg`` project or workspace (``create-dagster``'s layout: a
   ``dg.toml``, else ``[tool.dg]`` in ``pyproject.toml``; a project's
   ``code_location_target_module``, by default ``<root_module>.definitions``; a workspace's
   ``[[workspace.projects]]``), else a ``workspace.yaml``/``workspace.yml`` (its
   ``python_module`` and ``python_file`` entries), as ``dagster dev`` and ``dg`` read them.

A module's definitions are found as Dagster finds them: a ``@dg.definitions`` loader (which
may build them with ``load_from_defs_folder``), else one ``Definitions`` object.

The jobs, their :class:`IdempotentJobSpec` (which :func:`build_idempotent_job` attached to each
job) and the channel and model resources all come from the loaded ``Definitions``; nothing is
looked up by module path. Commands that need only the ledger never load a code location.
"""

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from idempotent_jobs.core.errors import InvalidInputError

CODE_LOCATION_ENV = "IDEMPOTENT_JOBS_CODE_LOCATION"
_WORKSPACE_FILES = ("workspace.yaml", "workspace.yml")
DG_TOML = "dg.toml"

CODE_LOCATION_ENV = "IDEMPOTENT_JOBS_CODE_LOCATION"
_WORKSPACE_FILES = ("workspace.yaml", "workspace.yml")
DG_TOML = "dg.toml"


class CodeLocationError(InvalidInputError):
    """No code location, or one that cannot be loaded: what was tried and how to say which."""

    def __init__(self, reason: str) -> None:
        super().__init__("code location", reason)


@dataclass(frozen=True, kw_only=True)
class Target:
    """One place to load definitions from: a module or a file, an attribute, a folder to import
    from, and where this target was found (said in messages)."""

    module: str | None = None
    python_file: Path | None = None
    attribute: str | None = None
    working_directory: Path | None = None
    found_in: str = "the command line"
    #: The pyproject.toml or workspace file this target was read from, if any.
    config_file: Path | None = None
    #: The code location's name as configured (``code_location_name``, ``location_name``).
    location_name: str | None = None
    #: Found through ``dg``'s configuration (a create-dagster project or a dg.toml workspace).
    dg_project: bool = False
    #: ``[tool.dg.project] autoload_defs``: ``module`` is the defs module, loaded as a folder.
    autoload_defs: bool = False

    @property
    def dagster_location_name(self) -> str:
        """The name ``dagster dev`` gives this code location: the configured one, else the
        module (or the file's name), with ``:attribute`` when one is given."""
        if self.location_name:
            return self.location_name
        base = self.module or (self.python_file.name if self.python_file else "")
        return f"{base}:{self.attribute}" if self.attribute else base

    def describe(self) -> str:
        what = f"module {self.module}" if self.module else f"file {self.python_file}"
        return what + (f" ({self.attribute})" if self.attribute else "") + f", {self.found_in}"


def _pyproject_targets(pyproject: Path) -> list[Target] | None:
    """The targets of ``[tool.dagster]``, or ``None`` when the file has no such block."""
    try:
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CodeLocationError(f"{pyproject} cannot be read: {exc}") from None
    tool = config.get("tool", {})
    if not isinstance(tool, dict):
        raise CodeLocationError(f"{pyproject}: `tool` must be a table, got {tool!r}")
    block = tool.get("dagster")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise CodeLocationError(f"{pyproject}: [tool.dagster] must be a table, got {block!r}")
    modules = block.get("module_name")
    if isinstance(modules, str):
        modules = [modules]
    if not modules or not all(isinstance(m, str) and m for m in modules):
        raise CodeLocationError(f"[tool.dagster] in {pyproject} names no module_name")
    folder = pyproject.parent
    working = _text_setting(block, "working_directory", f"[tool.dagster] in {pyproject}")
    attribute = _text_setting(block, "attribute", f"[tool.dagster] in {pyproject}")
    name = _text_setting(block, "code_location_name", f"[tool.dagster] in {pyproject}")
    return [
        Target(
            module=module,
            attribute=attribute,
            location_name=name,
            working_directory=(folder / working) if working else folder,
            found_in=f"from [tool.dagster] in {pyproject}",
            config_file=pyproject,
        )
        for module in modules
    ]


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CodeLocationError(f"{path} cannot be read: {exc}") from None


def _dg_config(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The ``dg`` configuration of ``folder`` and the file holding it: ``dg.toml`` (its top
    level), else ``[tool.dg]`` in ``pyproject.toml``, as ``dg`` reads them (a ``dg.toml``
    wins); ``None`` when the folder has neither."""
    dg_toml = folder / DG_TOML
    if dg_toml.is_file():
        return dg_toml, _toml(dg_toml)
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        return None
    tool = _toml(pyproject).get("tool", {})
    block = tool.get("dg") if isinstance(tool, dict) else None
    if block is None:
        return None
    if not isinstance(block, dict):
        raise CodeLocationError(f"{pyproject}: [tool.dg] must be a table, got {block!r}")
    return pyproject, block


def _dg_targets(folder: Path, found_via: Path | None = None) -> list[Target] | None:
    """The code locations of the ``dg`` project or workspace in ``folder`` (``None``: it is
    neither). A project's target is its ``code_location_target_module`` (by default
    ``<root_module>.definitions``), named ``code_location_name`` (by default the folder's
    name); a workspace's are those of each of its ``[[workspace.projects]]``."""
    found = _dg_config(folder)
    if found is None:
        return None
    path, config = found
    where = f"{path}" if path.name == DG_TOML else f"[tool.dg] in {path}"
    kind = config.get("directory_type")
    if kind == "workspace":
        workspace = config.get("workspace") or {}
        projects = workspace.get("projects") if isinstance(workspace, dict) else None
        if not isinstance(projects, list) or not projects:
            raise CodeLocationError(f"{where}: the workspace lists no [[workspace.projects]]")
        targets: list[Target] = []
        for number, entry in enumerate(projects, start=1):
            relative = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(relative, str) or not relative:
                raise CodeLocationError(f"{where}: workspace.projects[{number}] has no path")
            project_folder = (folder / relative).resolve()
            found_project = _dg_targets(project_folder, found_via=path)
            if not found_project:
                raise CodeLocationError(
                    f"{where}: workspace.projects[{number}] {relative} is not a dg project "
                    f"(no {DG_TOML} or [tool.dg] in {project_folder})"
                )
            targets += found_project
        return targets
    if kind != "project":
        raise CodeLocationError(
            f"{where}: directory_type must be 'project' or 'workspace', got {kind!r}"
        )
    project = config.get("project")
    if not isinstance(project, dict):
        raise CodeLocationError(f"{where}: a project needs a [project] table with root_module")
    root_module = _text_setting(project, "root_module", f"{where} [project]")
    if not root_module:
        raise CodeLocationError(f"{where}: [project] names no root_module")
    module = _text_setting(project, "code_location_target_module", f"{where} [project]")
    name = _text_setting(project, "code_location_name", f"{where} [project]")
    autoload = project.get("autoload_defs") is True
    if autoload:  # no definitions module: the defs folder is the code location
        module = _text_setting(project, "defs_module", f"{where} [project]")
        module = module or f"{root_module}.defs"
    # create-dagster puts the package under src/; dg imports it from the project's venv, where
    # it is installed: from src/ too, so a project not installed (yet) loads the same.
    source = folder / "src"
    package = Path(*root_module.split("."))
    in_src = (source / package).is_dir() or (source / package).with_suffix(".py").is_file()
    via = f" (listed in {found_via})" if found_via else ""
    return [
        Target(
            module=module or f"{root_module}.definitions",
            location_name=name or folder.name,
            working_directory=source if in_src else folder,
            found_in=f"from {where}{via}",
            config_file=path,
            dg_project=True,
            autoload_defs=autoload,
        )
    ]


def _text_setting(table: dict[str, Any], key: str, where: str) -> str | None:
    """``table[key]`` if it is a string (or absent: ``None``); else a one-line error."""
    value = table.get(key)
    if value is None or isinstance(value, str):
        return value
    raise CodeLocationError(f"{where}: {key} must be a string, got {value!r}")


def _workspace_targets(workspace: Path) -> list[Target]:
    """The ``python_module`` and ``python_file`` entries of a Dagster workspace file."""
    try:
        config = yaml.safe_load(workspace.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CodeLocationError(f"{workspace} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise CodeLocationError(
            f"{workspace}: the top level must be a mapping with load_from, "
            f"got a {type(config).__name__}"
        )
    entries = config.get("load_from") or []
    if not isinstance(entries, list):
        raise CodeLocationError(f"{workspace}: load_from must be a list of entries")
    folder = workspace.parent
    found_in = f"from {workspace}"
    targets: list[Target] = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            continue
        kind = next((k for k in ("python_module", "python_file") if k in entry), None)
        if kind is None:
            continue
        where = f"{workspace}: load_from entry {number} ({kind})"
        value = entry[kind]
        if isinstance(value, str):
            value = {"module_name" if kind == "python_module" else "relative_path": value}
        if not isinstance(value, dict):
            raise CodeLocationError(f"{where} must be a string or a mapping, got {value!r}")
        module = _text_setting(value, "module_name", where)
        relative = _text_setting(value, "relative_path", where)
        if kind == "python_module" and not module:
            raise CodeLocationError(f"{where} has no module_name")
        if kind == "python_file" and not relative:
            raise CodeLocationError(f"{where} has no relative_path")
        working = _text_setting(value, "working_directory", where)
        targets.append(
            Target(
                module=module if kind == "python_module" else None,
                python_file=folder / relative if kind == "python_file" and relative else None,
                attribute=_text_setting(value, "attribute", where),
                location_name=_text_setting(value, "location_name", where),
                working_directory=(folder / working) if working else folder,
                found_in=found_in,
                config_file=workspace,
            )
        )
    if not targets:
        raise CodeLocationError(f"{workspace} has no python_module or python_file entry")
    return targets


def _resolved(option: str, given: str) -> Path:
    """``given`` made absolute and free of links; a loop or an unreadable path is one line."""
    try:
        return Path(given).resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11, 3.12)
        raise CodeLocationError(f"{option} {given}: cannot be resolved ({exc})") from None


def find_targets(
    *,
    module: str | None = None,
    python_file: str | None = None,
    attribute: str | None = None,
    workspace: str | None = None,
    start: Path | None = None,
) -> list[Target]:
    """Where to load definitions from, by the rules in the module docstring."""
    if sum(bool(x) for x in (module, python_file, workspace)) > 1:
        raise CodeLocationError("give one of -m/--module-name, -f/--python-file, -w/--workspace")
    if attribute and not (module or python_file):
        raise CodeLocationError("-a/--attribute goes with -m/--module-name or -f/--python-file")
    here = (start or Path.cwd()).resolve()
    if module:
        return [Target(module=module, attribute=attribute, working_directory=here)]
    if python_file:
        path = _resolved("-f", python_file)
        if not path.is_file():
            raise CodeLocationError(f"-f {python_file}: no such file")
        return [Target(python_file=path, attribute=attribute, working_directory=here)]
    if workspace:
        path = _resolved("-w", workspace)
        if not path.is_file():
            raise CodeLocationError(f"-w {workspace}: no such file")
        return _workspace_targets(path)
    configured = os.environ.get(CODE_LOCATION_ENV, "").strip()
    if configured:
        name, _, attr = configured.partition(":")
        return [
            Target(
                module=name,
                attribute=attr or None,
                working_directory=here,
                found_in=f"from ${CODE_LOCATION_ENV}",
            )
        ]
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            targets = _pyproject_targets(pyproject)
            if targets:
                return targets
        targets = _dg_targets(folder)
        if targets:
            return targets
        for name in _WORKSPACE_FILES:
            if (folder / name).is_file():
                return _workspace_targets(folder / name)
    raise CodeLocationError(
        f"no Dagster code location found from {here}: pass -m <module> (or -f <file>, "
        f"-w <workspace.yaml>) before the command, set {CODE_LOCATION_ENV}=module[:attribute], "
        "or run it in a project whose pyproject.toml has [tool.dagster] module_name, in a "
        "create-dagster project or workspace ([tool.dg] or dg.toml), or in one with a "
        "workspace.yaml"
    )
