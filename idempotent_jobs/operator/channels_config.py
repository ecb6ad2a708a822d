"""Resources of the code location used outside Dagster: the notification channels (to deliver)
and the model (whose name configuration drift is compared to)."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from idempotent_jobs.dagster.resources import NotificationChannel, SummaryModel


@contextmanager
def configured_channels() -> Iterator[dict[str, NotificationChannel]]:
    """The ``NotificationChannel`` resources of the code location's definitions, by key, with
    their ``EnvVar`` settings resolved."""
    from idempotent_jobs.location.definitions import defs

    wanted = {k: v for k, v in (defs.resources or {}).items() if isinstance(v, NotificationChannel)}
    with dg.build_resources(wanted) as built:
        yield {key: getattr(built, key) for key in wanted}


def configured_model_name() -> str:
    """The model name of the code location's ``model`` resource (what drift is compared to)."""
    from idempotent_jobs.location.definitions import defs

    model = (defs.resources or {}).get("model")
    if not isinstance(model, SummaryModel):
        return ""
    with dg.build_resources({"model": model}) as built:
        name: str = built.model.model_name
    return name
