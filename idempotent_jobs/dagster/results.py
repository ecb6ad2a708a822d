"""Read what the ops reported back out of an in-process Dagster run."""

from typing import Any

import dagster as dg


def output_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """Each node's output metadata as plain values, e.g. ``["persist"]["result"]``."""
    found: dict[str, dict[str, Any]] = {}
    for event in result.all_node_events:
        if event.event_type == dg.DagsterEventType.STEP_OUTPUT and event.node_name:
            metadata = event.event_specific_data.metadata  # type: ignore[union-attr]
            found[event.node_name] = {key: value.value for key, value in metadata.items()}
    return found
