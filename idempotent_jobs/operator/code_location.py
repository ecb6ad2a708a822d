"""Load the user's Dagster code location (found by :mod:`~.location_targets`, as Dagster's CLI
finds it). A module's definitions are found as Dagster finds them: a ``@dg.definitions`` loader
(which may build them with ``load_from_defs_folder``), else one ``Definitions`` object.

The jobs, their :class:`IdempotentJobSpec` (which :func:`build_idempotent_job` attached to each
job) and the channel and model resources all come from the loaded ``Definitions``; nothing is
looked up by module path. Commands that need only the ledger never load a code location.
"""

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster.components import load_defs
from dagster.components.definitions import LazyDefinitions

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.dagster.job_factory import spec_of_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resource_errors import (
    describe_resource_error,
    validation_error,
    validation_text,
)
from idempotent_jobs.dagster.resources import ModelStep, NotificationChannel
from idempotent_jobs.dagster.yaml_limits import check_yaml_file
from idempotent_jobs.operator.location_targets import (
    CodeLocationError,
    Target,
    find_targets,
)

if TYPE_CHECKING:
    from idempotent_jobs.operator.outbox_router import OutboxRouter


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

    def spec_at_version(self, name: str, version: str) -> IdempotentJobSpec:
        """The spec of job ``name`` (Dagster or identity job name) at ``version``, or one
        sharing its identity job name at that version (a new version beside the old)."""
        for spec in self.specs:
            if spec.version == version and name in (spec.name, spec.identity_job_name):
                return spec
        identity = self.find_job(name).spec.identity_job_name
        for spec in self.specs:
            if (spec.identity_job_name, spec.version) == (identity, version):
                return spec
        defined = sorted({s.version for s in self.specs if s.identity_job_name == identity})
        raise InvalidInputError(
            "--version",
            f"no job of {self.describe()} has identity {identity}/{version}; its versions "
            f"there: {', '.join(defined)} (define the new version's spec, e.g. as a second job "
            "with the same identity_job_name, to shadow it)",
        )

    @contextmanager
    def model_step(self, spec: IdempotentJobSpec) -> Iterator[ModelStep]:
        """``spec``'s model step, built for the block (:class:`CodeLocationError` if it cannot)."""
        location = self.location_of(spec)
        resource = location.resources.get(spec.model)
        if not isinstance(resource, ModelStep):
            raise CodeLocationError(
                f"{location.target.describe()}: job {spec.name}'s model step {spec.model!r} is "
                "not a ModelStep resource of its Definitions"
            )
        with _built({spec.model: resource}, location) as built:
            yield getattr(built, spec.model)

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
            from idempotent_jobs.operator.outbox_router import OutboxRouter

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
