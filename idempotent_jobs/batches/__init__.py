"""The batch lane: backfills through the providers' batch APIs, each batch submitted once and
each of its runs accepted once (:mod:`idempotent_jobs.batches.lane`)."""

from idempotent_jobs.batches.lane import BatchProgress, BatchSteps, advance, open_intent, progress

__all__ = ["BatchProgress", "BatchSteps", "advance", "open_intent", "progress"]
