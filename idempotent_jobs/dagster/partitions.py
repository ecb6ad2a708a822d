"""Partitions: a time window x subject grid, and the run identity of one partition key."""

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import dagster as dg
import yaml

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import RunIdentity, clean_identity_text
from idempotent_jobs.dagster.yaml_limits import check_yaml_file

WINDOW = "window"
SUBJECT = "subject"
SUBJECTS_FILE_ENV = "IDEMPOTENT_JOBS_SUBJECTS_FILE"


def load_subjects(job_name: str, default_file: str | Path) -> list[str]:
    """The configured subjects of ``job_name``, from ``$IDEMPOTENT_JOBS_SUBJECTS_FILE`` or, when
    that is unset, ``default_file`` (a YAML mapping of job name to its list of subjects)."""
    source = Path(os.environ.get(SUBJECTS_FILE_ENV) or default_file)
    check_yaml_file(source)
    config = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    if not isinstance(config, dict):
        raise InvalidInputError("subjects", f"{source} is not a mapping of job name to subjects")
    subjects = config.get(job_name)
    if not isinstance(subjects, list) or not subjects:
        raise InvalidInputError("subjects", f"{source} lists no subjects for job {job_name!r}")
    # Partition keys are the subjects as written (stripped): release 0.1 made them so, and a
    # key that changed would orphan the partition's history in Dagster. The run identity puts
    # them in NFC, so two spellings of one subject would be one run: refused.
    cleaned = [clean_identity_text("subject_id", s) for s in subjects]
    if len(set(cleaned)) != len(cleaned):
        raise InvalidInputError(
            "subjects",
            f"{source} lists a subject twice for {job_name!r} (perhaps in two Unicode forms)",
        )
    return [s.strip() for s in subjects]


def window_by_subject(
    window: dg.TimeWindowPartitionsDefinition, subjects: Sequence[str]
) -> dg.MultiPartitionsDefinition:
    """Partitions of ``window`` (time) x ``subject``; keys read ``<subject>|<window>``."""
    return dg.MultiPartitionsDefinition(
        {WINDOW: window, SUBJECT: dg.StaticPartitionsDefinition(list(subjects))}
    )


def partition_key(subject: str, window_key: str) -> str:
    """The key of one partition, ``<subject>|<window>`` (Dagster orders a multi-partition key's
    dimensions by name): the only place a key is built."""
    return str(dg.MultiPartitionKey({WINDOW: window_key, SUBJECT: subject}))


def split_partition_key(partition_key: str) -> tuple[str, str]:
    """The subject and window of a key :func:`partition_key` built; :class:`InvalidInputError`
    for anything else."""
    parts = str(partition_key).split("|")
    if len(parts) != 2:
        raise InvalidInputError("partition_key", f"{partition_key!r} is not '<subject>|<window>'")
    return parts[0], parts[1]


def identity_for_partition(
    partitions_def: dg.MultiPartitionsDefinition, partition_key: str, job_name: str, version: str
) -> RunIdentity:
    """The run identity of a partition: the window's UTC start, never the worker's clock."""
    split_partition_key(partition_key)
    key = partitions_def.get_partition_key_from_str(str(partition_key))
    subject = key.keys_by_dimension[SUBJECT]
    window_key = key.keys_by_dimension[WINDOW]
    subjects_def = partitions_def.get_partitions_def_for_dimension(SUBJECT)
    if subject not in subjects_def.get_partition_keys():
        raise InvalidInputError("partition_key", f"subject {subject!r} is not configured")
    window_def = partitions_def.get_partitions_def_for_dimension(WINDOW)
    assert isinstance(window_def, dg.TimeWindowPartitionsDefinition)
    try:
        start = window_def.time_window_for_partition_key(window_key).start
    except Exception:
        raise InvalidInputError(
            "partition_key", f"window {window_key!r} is not a key of {window_def.fmt!r}"
        ) from None
    if start < window_def.start:
        raise InvalidInputError(
            "partition_key", f"window {window_key!r} starts before the partitions' first window"
        )
    return RunIdentity(job_name, subject, start, version)


def partition_key_of(
    partitions_def: dg.MultiPartitionsDefinition, subject: str, scheduled_at: datetime
) -> str:
    """The key of the partition whose run has ``subject`` and window start ``scheduled_at``
    (:func:`identity_for_partition`'s inverse)."""
    window_def = partitions_def.get_partitions_def_for_dimension(WINDOW)
    assert isinstance(window_def, dg.TimeWindowPartitionsDefinition)
    return partition_key(
        subject, window_def.get_partition_key_for_timestamp(scheduled_at.timestamp())
    )
