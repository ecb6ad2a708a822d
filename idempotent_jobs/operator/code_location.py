"""Find and load the user's Dagster code location, the way Dagster's own CLI does.

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

import importlib
import importlib.util
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster.components import load_defs
from dagster.components.definitions import LazyDefinitions

from idempotent_jobs.core.errors import InvalidInputError, LedgerError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import JobConfig, OutboxRecord
from idempotent_jobs.dagster.job_factory import spec_of_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resource_errors import (
    describe_resource_error,
    validation_error,
    validation_text,
)
from idempotent_jobs.dagster.resources import ModelStep, NotificationChannel
from idempotent_jobs.dagster.yaml_limits import check_yaml_file

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


@dataclass(frozen=True, kw_only=True)
class JobMatch:
    """A ``--job`` value resolved: the spec, and which of its names matched."""

    spec: IdempotentJobSpec
    matched: str  # "Dagster job" or "identity job"

    def describe(self) -> str:
        other = (
            f"identity job {self.spec.identity_job_name}"
            if self.matched == "Dagster job"
            else f"Dagster job {self.spec.name}"
        )
        name = self.spec.name if self.matched == "Dagster job" else self.spec.identity_job_name
        return f"{self.matched} {name} ({other})"


@dataclass(frozen=True, kw_only=True)
class CodeLocation:
    """The loaded ``Definitions`` of one target and the idempotent job specs in them."""

    defs: dg.Definitions
    target: Target
    specs: tuple[IdempotentJobSpec, ...] = field(default=())

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.defs.resources or {})


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """Every code location the CLI loaded (a workspace file may name several)."""

    locations: tuple[CodeLocation, ...]

    @property
    def specs(self) -> list[IdempotentJobSpec]:
        return [spec for location in self.locations for spec in location.specs]

    def describe(self) -> str:
        return "; ".join(location.target.describe() for location in self.locations)

    def location_of(self, spec: IdempotentJobSpec) -> CodeLocation:
        return next(loc for loc in self.locations if spec in loc.specs)

    def known_jobs(self) -> str:
        names = [f"{s.name} (identity {s.identity_job_name})" for s in self.specs]
        return ", ".join(names) or "none: no job of these definitions was built by idempotent-jobs"

    def find_job(self, name: str) -> JobMatch:
        """The job ``name`` names, by its Dagster job name or its identity job name; raise
        (exit 2) listing the known jobs if neither matches."""
        for spec in self.specs:
            if spec.name == name:
                return JobMatch(spec=spec, matched="Dagster job")
        for spec in self.specs:
            if spec.identity_job_name == name:
                return JobMatch(spec=spec, matched="identity job")
        raise InvalidInputError(
            "--job",
            f"no job named {name!r} in {self.describe()}; the jobs are: {self.known_jobs()}",
        )

    def spec_for_identity(self, job_name: str, version: str) -> IdempotentJobSpec:
        """The spec whose runs have this identity job name and version; raise if none."""
        for spec in self.specs:
            if (spec.identity_job_name, spec.version) == (job_name, version):
                return spec
        raise InvalidInputError(
            "run",
            f"no job of {self.describe()} has identity {job_name}/{version}; "
            f"the jobs are: {self.known_jobs()}",
        )

    def owners(self, only: IdempotentJobSpec | None = None) -> dict[str, CodeLocation]:
        """The code location that owns each identity job (``only``'s alone when given). Two
        locations defining one identity job cannot both own its side effects: that is refused,
        naming both, before anything is sent."""
        owners: dict[str, CodeLocation] = {}
        for location in self.locations:
            for spec in location.specs:
                if only is not None and spec is not only:
                    continue
                job = normalize_text(spec.identity_job_name)
                other = owners.setdefault(job, location)
                if other is not location:
                    raise CodeLocationError(
                        f"identity job {job!r} is defined by two code locations "
                        f"({other.target.describe()}; {location.target.describe()}): "
                        "name one with -m/-f/-w so its side effects have one owner"
                    )
        return owners

    @contextmanager
    def delivery(self, only: IdempotentJobSpec | None = None) -> Iterator["OutboxRouter"]:
        """An :class:`OutboxRouter` over the channels of the jobs these locations own (``only``:
        that job's), each location's channels built apart (``EnvVar`` settings resolved from
        this process's environment); a missing variable is one :class:`CodeLocationError`."""
        owners = self.owners(only)
        built: dict[int, dict[str, NotificationChannel]] = {}
        with ExitStack() as stack:
            for location in {id(loc): loc for loc in owners.values()}.values():
                named = {c for spec in location.specs for c in spec.channels}
                wanted = {
                    key: resource
                    for key, resource in location.resources.items()
                    if key in named and isinstance(resource, NotificationChannel)
                }
                resources = stack.enter_context(_built(wanted, location))
                built[id(location)] = {key: getattr(resources, key) for key in wanted}
            yield OutboxRouter(owners=owners, channels=built)

    def check_resources(self, spec: IdempotentJobSpec) -> None:
        """Build every resource ``spec``'s job needs (its ledger, collector, model step and
        channels) and release them: an unset variable or a missing resource is one
        :class:`CodeLocationError` before anything is written (``revise --now``)."""
        location = self.location_of(spec)
        needed = {"ledger", spec.collector, spec.model, *spec.channels}
        missing = sorted(needed - set(location.resources))
        if missing:
            raise CodeLocationError(
                f"{location.target.describe()}: job {spec.name} needs the resource(s) "
                f"{', '.join(missing)}, which its Definitions do not provide"
            )
        with _built({key: location.resources[key] for key in needed}, location):
            pass

    def configs(self, specs: Sequence[IdempotentJobSpec]) -> dict[str, JobConfig]:
        """Each spec's configuration under its location's model step resource (what drift is
        compared to), by spec name; a spec whose model step is not a resource is left out.

        Comparing needs the model's name and settings, never its secrets: when a setting's
        ``EnvVar`` is unset here (a health check's pod has no API key), the configuration is
        read from the resource as declared, which calls nothing out."""
        configs: dict[str, JobConfig] = {}
        for spec in specs:
            resource = self.location_of(spec).resources.get(spec.model)
            if not isinstance(resource, ModelStep):
                continue
            try:
                with dg.build_resources({spec.model: resource}) as built:
                    configs[spec.name] = spec.config_of(getattr(built, spec.model))
            except dg.DagsterInvalidConfigError:  # an unset variable, most likely a secret
                configs[spec.name] = spec.config_of(resource)
        return configs


@dataclass(frozen=True, kw_only=True)
class OutboxRouter:
    """Sends each outbox row through a channel of the code location that owns the row's job:
    the job's spec names the channel, its location provides it. Rows of other jobs are never
    sent (:attr:`job_names` is what the deliverer asks the ledger for)."""

    owners: dict[str, CodeLocation]
    channels: dict[int, dict[str, NotificationChannel]]

    @property
    def job_names(self) -> list[str]:
        return sorted(self.owners)

    def send(self, row: OutboxRecord) -> None:
        location = self.owners.get(row.job_name or "")
        if location is None:  # the ledger was asked for owned jobs only: a row moved under us
            raise LedgerError(f"job {row.job_name!r} is not owned by the loaded code location")
        specs = [s for s in location.specs if normalize_text(s.identity_job_name) == row.job_name]
        if not any(row.channel in spec.channels for spec in specs):
            raise LedgerError(
                f"job {row.job_name!r} names no channel {row.channel!r} "
                f"(its channels: {', '.join(sorted({c for s in specs for c in s.channels}))})"
            )
        channel = self.channels[id(location)].get(row.channel)
        if channel is None:
            raise LedgerError(
                f"no notification channel resource named {row.channel!r} in "
                f"{location.target.describe()}"
            )
        channel.send(row)


@contextmanager
def _built(resources: dict[str, Any], location: CodeLocation) -> Iterator[Any]:
    """``dg.build_resources(resources)``; a setting that cannot be resolved (an unset
    ``EnvVar``) is one :class:`CodeLocationError` naming the location and the reason."""
    try:
        context = dg.build_resources(resources)
        built = context.__enter__()
    except dg.DagsterError as exc:
        raise CodeLocationError(
            f"the resources of {location.target.describe()} cannot be built: "
            f"{describe_resource_error(exc)}"
        ) from None
    try:
        yield built
    finally:
        context.__exit__(None, None, None)


# -- finding the target ---------------------------------------------------------------------


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


# -- loading --------------------------------------------------------------------------------


def _check_component_yaml(target: Target) -> None:
    """The project's component files (``defs.yaml``) within the YAML limits, checked before
    Dagster parses them (an alias bomb would hang it)."""
    assert target.module is not None
    package = Path(target.working_directory or Path.cwd()) / target.module.split(".")[0]
    if not package.is_dir():
        return
    for path in sorted(package.rglob("defs.yaml")):
        try:
            check_yaml_file(path)
        except InvalidInputError as exc:
            raise CodeLocationError(f"{target.describe()}: {exc}") from None


def _import(target: Target) -> Any:
    """Import the target's module. Whatever it prints goes to stderr (so ``--json`` output
    stays valid), and a ``sys.exit()`` in it is one :class:`CodeLocationError` naming it."""
    folder = str(target.working_directory or Path.cwd())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        with redirect_stdout(sys.stderr):
            return _import_module(target)
    except SystemExit as exc:
        raise CodeLocationError(
            f"{target.describe()} called sys.exit({exc.code!r}) while being imported"
        ) from None


def _import_module(target: Target) -> Any:
    try:
        if target.module:
            return importlib.import_module(target.module)
        assert target.python_file is not None
        name = f"idempotent_jobs_user_location_{abs(hash(str(target.python_file)))}"
        spec = importlib.util.spec_from_file_location(name, target.python_file)
        if spec is None or spec.loader is None:
            raise CodeLocationError(f"{target.python_file} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    except CodeLocationError:
        raise
    except Exception as exc:
        raise CodeLocationError(
            f"{target.describe()} could not be imported: {type(exc).__name__}: {exc}"
        ) from exc


def _definitions(module: Any, target: Target) -> dg.Definitions:
    """The module's definitions, found as Dagster finds them: the attribute named, else a
    ``@dg.definitions`` loader (called: it may load a defs folder), else one ``Definitions``."""
    if target.attribute:
        value = getattr(module, target.attribute, None)
        if isinstance(value, LazyDefinitions):
            value = _loaded(value, target, f"the @dg.definitions loader {target.attribute}")
        if not isinstance(value, dg.Definitions):
            raise CodeLocationError(
                f"{target.describe()}: {target.attribute!r} is not a dagster Definitions"
            )
        return value
    members = vars(module).items()
    loaders = {k: v for k, v in members if isinstance(v, LazyDefinitions)}
    if len(loaders) > 1:
        raise CodeLocationError(
            f"{target.describe()} has several @dg.definitions loaders "
            f"({', '.join(sorted(loaders))}): say which with -a/--attribute"
        )
    if loaders:
        [(name, loader)] = loaders.items()
        loaded = _loaded(loader, target, f"the @dg.definitions loader {name}")
        if not isinstance(loaded, dg.Definitions):
            raise CodeLocationError(f"{target.describe()}: its loader returned no Definitions")
        return loaded
    found = {k: v for k, v in members if isinstance(v, dg.Definitions)}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise CodeLocationError(
            f"{target.describe()} defines no dagster Definitions (nor a @dg.definitions loader)"
        )
    raise CodeLocationError(
        f"{target.describe()} defines several Definitions ({', '.join(sorted(found))}): "
        "say which with -a/--attribute"
    )


def _loaded(load: Callable[[], Any], target: Target, what: str) -> Any:
    """What ``load`` returns (a ``@dg.definitions`` loader, a defs folder: components are built
    here); a failure is one :class:`CodeLocationError` naming ``what`` failed."""
    try:
        with redirect_stdout(sys.stderr):
            return load()
    except Exception as exc:
        invalid = validation_error(exc)
        if invalid is not None:  # a component's attributes or a resource's settings
            raise CodeLocationError(
                f"{target.describe()}: {what} failed: {validation_text(invalid)}"
            ) from None
        why = f"{type(exc).__name__}: {describe_resource_error(exc)}"
        cause = exc
        while cause.__cause__ is not None:  # a component's own error, wrapped by Dagster
            cause = cause.__cause__  # type: ignore[assignment]
        if cause is not exc:
            why += f" {type(cause).__name__}: {describe_resource_error(cause)}"
        raise CodeLocationError(f"{target.describe()}: {what} failed: {why}") from None


def load_location(target: Target) -> CodeLocation:
    """Import the target and collect the idempotent job specs of its jobs; definitions Dagster
    refuses (two jobs of one name, a resource missing) are one :class:`CodeLocationError`."""
    if target.dg_project:
        _check_component_yaml(target)
    module = _import(target)
    if target.autoload_defs:
        defs = _loaded(lambda: load_defs(module), target, "its defs folder")
    else:
        defs = _definitions(module, target)
    try:
        with redirect_stdout(sys.stderr):
            repository = defs.get_repository_def()
            jobs = repository.get_all_jobs()
    except SystemExit as exc:
        raise CodeLocationError(
            f"{target.describe()} called sys.exit({exc.code!r}) while being loaded"
        ) from None
    except Exception as exc:
        raise CodeLocationError(
            f"{target.describe()}: its definitions cannot be loaded: "
            f"{type(exc).__name__}: {describe_resource_error(exc)}"
        ) from None
    specs = [spec_of_job(job) for job in jobs]
    return CodeLocation(defs=defs, target=target, specs=tuple(s for s in specs if s is not None))


def load_workspace(
    *,
    module: str | None = None,
    python_file: str | None = None,
    attribute: str | None = None,
    workspace: str | None = None,
    start: Path | None = None,
) -> Workspace:
    targets = find_targets(
        module=module,
        python_file=python_file,
        attribute=attribute,
        workspace=workspace,
        start=start,
    )
    return Workspace(locations=tuple(load_location(t) for t in targets))
