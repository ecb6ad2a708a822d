"""Resources of the code location used outside Dagster: the notification channels (to deliver)
and the model steps (whose configuration drift is compared to)."""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import dagster as dg

from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resources import ModelStep, NotificationChannel


@contextmanager
def configured_channels() -> Iterator[dict[str, NotificationChannel]]:
    """The ``NotificationChannel`` resources of the code location's definitions, by key, with
    their ``EnvVar`` settings resolved."""
    from idempotent_jobs.location.definitions import defs

    wanted = {k: v for k, v in (defs.resources or {}).items() if isinstance(v, NotificationChannel)}
    with dg.build_resources(wanted) as built:
        yield {key: getattr(built, key) for key in wanted}


def configured_configs(specs: Sequence[IdempotentJobSpec]) -> dict[str, JobConfig]:
    """Each spec's configuration under the code location's model step resources (what
    configuration drift is compared to), by spec name. A spec whose model step resource is not
    in the definitions is left out: there is nothing to compare with."""
    from idempotent_jobs.location.definitions import defs

    resources = defs.resources or {}
    wanted = {
        s.model: resources[s.model] for s in specs if isinstance(resources.get(s.model), ModelStep)
    }
    with dg.build_resources(wanted) as built:
        return {s.name: s.config_of(getattr(built, s.model)) for s in specs if s.model in wanted}
