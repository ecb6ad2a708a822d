"""Shadow runs: a new version of a job computed on stored runs' inputs, paid and recorded like
any call, compared answer by answer with the accepted ones, never accepted nor delivered until
a promotion re-delivers the changed answers through revisions. See ``docs/shadow.md``."""

from idempotent_jobs.shadows.compare import Verdict, compare_fields, judge
from idempotent_jobs.shadows.job import ShadowProgress, ShadowRule, ShadowSteps
from idempotent_jobs.shadows.lane import advance, drop, progress, start
from idempotent_jobs.shadows.promotion import gate_reason, promote

__all__ = [
    "ShadowProgress",
    "ShadowRule",
    "ShadowSteps",
    "Verdict",
    "advance",
    "compare_fields",
    "drop",
    "gate_reason",
    "judge",
    "progress",
    "promote",
    "start",
]
