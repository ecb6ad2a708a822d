"""Dagster resources: each abstract, with an offline default and a real implementation."""

from idempotent_jobs.dagster.resources.channels import (
    JsonLinesChannel,
    NotificationChannel,
    WebhookChannel,
)
from idempotent_jobs.dagster.resources.collectors import (
    DocumentCollector,
    FeedCollector,
    SampleDocumentsCollector,
)
from idempotent_jobs.dagster.resources.models import (
    LocalExtractiveSummarizer,
    OpenAICompatibleSummaryModel,
    SummaryModel,
)
from idempotent_jobs.dagster.resources.real_models import (
    AnthropicModel,
    OpenAICompatibleModel,
    StructuredModel,
)
from idempotent_jobs.dagster.resources.steps import Collector, ModelStep, StepContext

__all__ = [
    "AnthropicModel",
    "Collector",
    "ModelStep",
    "StepContext",
    "DocumentCollector",
    "FeedCollector",
    "JsonLinesChannel",
    "LocalExtractiveSummarizer",
    "NotificationChannel",
    "OpenAICompatibleModel",
    "OpenAICompatibleSummaryModel",
    "SampleDocumentsCollector",
    "StructuredModel",
    "SummaryModel",
    "WebhookChannel",
]
