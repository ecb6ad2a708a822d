"""The notification channels configured in the code location, for delivering outside Dagster."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from idempotent_jobs.resources import NotificationChannel


@contextmanager
def configured_channels() -> Iterator[dict[str, NotificationChannel]]:
    """The ``NotificationChannel`` resources of ``idempotent_jobs.definitions``, by key, with
    their ``EnvVar`` settings resolved."""
    from idempotent_jobs.definitions import defs

    wanted = {k: v for k, v in (defs.resources or {}).items() if isinstance(v, NotificationChannel)}
    with dg.build_resources(wanted) as built:
        yield {key: getattr(built, key) for key in wanted}
