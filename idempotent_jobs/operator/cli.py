"""The ``idempotent-jobs`` command line: tables by default, ``--json`` for scripts.

Building the parser imports nothing heavy: psycopg is imported by the commands that talk to the
ledger, and Dagster only by those that need it (``dev``, ``reconcile``, ``revise --now``, the demo),
so ``--help`` and ``runs list`` start in a fraction of a second.
"""

import argparse
import math
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import InvalidInputError, LedgerError, RunNotFoundError
from idempotent_jobs.operator.render import escape_controls, human_bytes, table, to_json

if TYPE_CHECKING:
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.core.retention import RetentionPolicy
    from idempotent_jobs.operator.code_location import Workspace

DATABASE_URL_ENV = "IDEMPOTENT_JOBS_DATABASE_URL"  # core.database's, without importing psycopg


def ensure_database_url() -> str:
    from idempotent_jobs.operator.embedded import ensure_database_url as ensure

    return ensure()


def _ledger(args: argparse.Namespace) -> "RunLedger":
    from idempotent_jobs.core.ledger import RunLedger

    return RunLedger(
        ensure_database_url(),
        schema=args.schema,
        connect_timeout_seconds=args.connect_timeout,
    )


def _workspace(args: argparse.Namespace) -> "Workspace":
    """The user's code location, found as Dagster's CLI finds it (see
    ``operator/code_location.py``): only the commands that need jobs or channels load it."""
    from idempotent_jobs.operator.code_location import load_workspace

    return load_workspace(
        module=args.module_name,
        python_file=args.python_file,
        attribute=args.attribute,
        workspace=args.workspace,
    )


def _when(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a timezone, e.g. 2026-08-07T00:00Z")
    return value


#: The largest value each kind of numeric option takes: a number past these is a typo, and
#: would overflow a date or a libpq setting further on.
MAX_SECONDS = 3600.0 * 24 * 366 * 10  # ten years
MAX_DAYS = 366.0 * 100  # a century
MAX_COUNT = 10_000_000


def _positive(
    kind: type[int] | type[float], maximum: float = MAX_COUNT, *, zero: bool = False
) -> Any:
    """An argparse type: a finite number > 0 (>= 0 with ``zero``) and <= ``maximum`` (else
    exit 2, saying why)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < 0 or (value == 0 and not zero):
            least = "at least 0" if zero else "greater than 0"
            raise argparse.ArgumentTypeError(f"must be {least}, got {text}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(to_json(data) if args.json else human)


# -- commands ---------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    report = _ledger(args).upgrade()
    print(f"applied: {', '.join(report.applied)}" if report.applied else "schema is up to date")
    for line in report.done:
        print(f"done: {escape_controls(line)}")
    for line in report.found:
        print(f"found: {escape_controls(line)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.dagster_demo import run_dagster_demo
    from idempotent_jobs.operator.demo import run_demo

    def say(line: str) -> None:  # model answers are printed: escape what a terminal acts on
        print(escape_controls(line))

    embedded = not os.environ.get(DATABASE_URL_ENV)
    if not embedded and not args.any_database:
        raise InvalidInputError(
            "demo",
            f"{DATABASE_URL_ENV} is set: the demo runs only on the project's embedded database, "
            "so that it never reuses or delivers another deployment's runs; unset it, or pass "
            "--any-database",
        )
    ledger = _ledger(args)
    ledger.migrate()
    with ledger:
        run_demo(ledger, say)
        print()
        run_dagster_demo(ledger, say)
    if embedded:
        from idempotent_jobs.operator.database_commands import data_directory

        print(
            f"\nthe ledger is the embedded PostgreSQL in {data_directory()}; it keeps running. "
            "`idempotent-jobs db stop` stops it, `db psql` opens psql on it, and "
            '`eval "$(idempotent-jobs db env)"` lets plain `dagster dev` use it'
        )
    return 0


def _db(name: str) -> Any:
    """The handler ``name`` of ``operator/database_commands.py``, imported when it runs."""

    def handler(args: argparse.Namespace) -> int:
        from idempotent_jobs.operator import database_commands

        code: int = getattr(database_commands, name)(args)
        return code

    return handler


def _dev(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.dev import run_dev

    return run_dev(
        args.host,
        args.port,
        module=args.module_name,
        python_file=args.python_file,
        attribute=args.attribute,
        workspace=args.workspace,
    )


def _identity_job(args: argparse.Namespace, ledger: "RunLedger") -> tuple[str | None, str]:
    """``--job`` as the identity job name the ledger keys runs by. An identity name the ledger
    holds is used as it is (no code is loaded); another name is looked up in the code location
    (a Dagster job name); a name neither knows exits 2, listing the ledger's jobs."""
    from idempotent_jobs.operator.code_location import CodeLocationError

    if args.job is None:
        return None, ""
    from idempotent_jobs.core.identity import normalize_text

    held = ledger.job_names()
    name = normalize_text(str(args.job))  # as identities store it: stripped, NFC
    if name in held:
        return name, f"identity job {name}"
    try:
        match = _workspace(args).find_job(name)
    except (CodeLocationError, InvalidInputError) as exc:
        reason = exc.reason if isinstance(exc, InvalidInputError) else str(exc)
        raise InvalidInputError(
            "--job",
            f"no runs of a job named {args.job!r}: the ledger's jobs are "
            f"{', '.join(held) or 'none yet'}; as a Dagster job name: {reason}",
        ) from None
    return match.spec.identity_job_name, match.describe()


def _runs_list(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        job_name, matched = _identity_job(args, ledger)
        runs = ledger.list_runs(
            job_name=job_name,
            subject_id=args.subject,
            status=args.status,
            since=args.since,
            until=args.until,
            limit=args.limit,
            after=args.after,
        )
    rows = [
        (
            r.run_id[:12],
            r.job_name,
            r.subject_id,
            r.scheduled_at,
            r.version,
            r.status,
            r.lease_epoch,
            r.attempts,
            r.revision,
            r.lease_owner,
            r.last_error,
        )
        for r in runs
    ]
    headers = [
        "run",
        "job",
        "subject",
        "window",
        "version",
        "status",
        "epoch",
        "attempts",
        "revision",
        "lease owner",
        "last error",
    ]
    human = table(headers, rows)
    if matched:
        human = f"job: {escape_controls(matched)}\n{human}"
    if len(runs) == args.limit:
        human += f"\nnext page: --after {runs[-1].run_id[:12]}"
    _emit(args, runs, human)
    return 0


def _runs_stats(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        tables, parts = ledger.storage()
    approx = any(p.estimated for p in parts)
    rows = [
        (
            p.job_name,
            p.part,
            f"{'~' if p.estimated else ''}{p.rows:,}",
            f"{'~' if p.estimated else ''}{human_bytes(p.bytes)}",
        )
        for p in parts
    ]
    disk = [
        (
            t.table_name,
            None if t.estimated_rows is None else f"~{t.estimated_rows:,}",
            human_bytes(t.total_bytes),
        )
        for t in tables
    ]
    human = "\n".join(
        [
            table(["job", "part", "rows", "stored bytes"], rows),
            "",
            "on disk (indexes and TOAST included):",
            table(["table", "rows", "bytes"], disk),
        ]
        + (["", "~: estimated from a sample of the table's pages"] if approx else [])
    )
    _emit(args, {"tables": tables, "parts": parts}, human)
    return 0


def _runs_show(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        run_id = ledger.resolve_run_id(args.run_id)
        record = ledger.get(run_id)
        if record is None:
            print(f"idempotent-jobs: no run {run_id}", file=sys.stderr)
            return 1
        attempts = ledger.attempts(run_id)
        calls = ledger.model_calls(run_id)
        outbox = ledger.outbox(run_id)
        revisions = ledger.revisions(run_id)
    from idempotent_jobs.core.records import CallCosts

    costs = CallCosts.of(calls)
    data = {
        "run": record,
        "attempts": attempts,
        "model_calls": calls,
        "costs": costs,
        "outbox": outbox,
        "revisions": revisions,
    }
    identity = [
        ("run id", record.run_id),
        ("job", record.job_name),
        ("subject", record.subject_id),
        ("window start", record.scheduled_at),
        ("version", record.version),
        ("status", record.status),
        ("epoch", record.lease_epoch),
        ("attempts", record.attempts),
        ("revision", record.revision),
        ("lease owner", record.lease_owner),
        ("lease expires", record.lease_expires_at),
        ("completed at", record.completed_at),
        ("input fingerprint", record.input_fingerprint),
        ("config fingerprint", record.config_fingerprint),
        ("config", record.config_parts),
        ("last error", record.last_error),
        ("output", record.output),
        ("raw input pruned", record.raw_input_pruned_at),
        ("output pruned", record.output_pruned_at),
        ("ended attempts pruned", record.attempts_pruned_at),
    ]
    attempt_rows = [
        (
            a.lease_epoch,
            a.worker_id,
            a.caller_run_id,
            a.caller_step,
            a.outcome,
            a.error,
            a.model_name,
            a.input_tokens,
            a.output_tokens,
            f"{(a.ended_at - a.started_at).total_seconds():.3f}s" if a.ended_at else "-",
        )
        for a in attempts
    ]
    call_rows = [
        (
            c.called_at,
            c.revision,
            c.lease_epoch,
            c.caller_step,
            c.caller_run_id,
            c.retry_number,
            c.model_name,
            c.input_tokens,
            c.output_tokens,
            c.outcome,
            c.error,
        )
        for c in calls
    ]
    outbox_rows = [
        (
            o.idempotency_key,
            o.created_at,
            o.delivered_at,
            o.delivery_attempts,
            o.last_error,
            o.payload_pruned_at,
        )
        for o in outbox
    ]
    revision_rows = [
        (v.revision, v.requested_at, v.reason, ",".join(v.channels) or "-", v.previous_output)
        for v in revisions
    ]
    human = "\n".join(
        [
            table(["field", "value"], identity),
            "",
            "attempts:",
            table(
                [
                    "epoch",
                    "worker",
                    "dagster run",
                    "step",
                    "outcome",
                    "error",
                    "model",
                    "in tokens",
                    "out tokens",
                    "duration",
                ],
                attempt_rows,
            ),
            "",
            "model calls:",
            table(
                [
                    "called",
                    "revision",
                    "epoch",
                    "step",
                    "dagster run",
                    "retry",
                    "model",
                    "in tokens",
                    "out tokens",
                    "outcome",
                    "error",
                ],
                call_rows,
            ),
            f"cost: {costs.summary()}",
            "",
            "outbox:",
            table(
                ["key", "queued", "delivered", "tries", "last error", "payload pruned"],
                outbox_rows,
            ),
            "",
            "revisions:",
            table(
                ["revision", "requested", "reason", "channels", "previous output"], revision_rows
            ),
        ]
    )
    _emit(args, data, human)
    return 0


def _outbox_list(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        run_id = ledger.resolve_run_id(args.run) if args.run else None
        rows = ledger.outbox(run_id, pending_only=args.pending, limit=args.limit)
    human = table(
        ["key", "queued", "delivered", "tries", "last error", "payload"],
        [
            (
                o.idempotency_key,
                o.created_at,
                o.delivered_at,
                o.delivery_attempts,
                o.last_error,
                o.payload if o.payload_pruned_at is None else f"(pruned {o.payload_pruned_at})",
            )
            for o in rows
        ],
    )
    _emit(args, rows, human)
    return 0


def _outbox_deliver(args: argparse.Namespace) -> int:
    workspace = _workspace(args)
    with _ledger(args) as ledger, workspace.channels() as channels:
        run_id = ledger.resolve_run_id(args.run) if args.run else None

        def send(row: Any) -> None:
            channel = channels.get(row.channel)
            if channel is None:
                raise LedgerError(
                    f"no notification channel resource named {row.channel!r} in "
                    f"{workspace.describe()}"
                )
            channel.send(row)

        report = ledger.deliver_outbox(send, run_id=run_id, limit=args.limit)
    human = table(
        ["key", "result"],
        [(r.idempotency_key, "delivered") for r in report.delivered]
        + [(r.idempotency_key, f"failed: {reason}") for r, reason in report.failed],
    )
    _emit(args, report, human)
    return 1 if report.failed else 0


def _print_findings(args: argparse.Namespace, findings: list[Any], checks: list[str]) -> int:
    problems = [f for f in findings if f.severity == "problem"]
    human = "\n".join(
        [
            *checks,
            "",
            table(
                ["severity", "kind", "run", "detail"],
                [(f.severity, f.kind, (f.run_id or "-")[:12], f.detail) for f in findings],
            ),
        ]
        + [f"\n{len(problems)} problem(s), {len(findings) - len(problems)} informational"]
    )
    _emit(args, {"checks": checks, "findings": findings, "problems": len(problems)}, human)
    return 1 if problems else 0


def _doctor(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.grants import worker_role
    from idempotent_jobs.core.health import Finding, ledger_findings

    ledger = _ledger(args)
    checks = []
    try:  # first, so a role without USAGE on the schema hears what it lacks
        role, missing = ledger.missing_privileges()
    except LedgerError:
        role, missing = "", []  # no connection or no schema: opening says which, below
    lacking = (
        f"problem: role {role} lacks {', '.join(missing)}: as the schema's owner, "
        f"`GRANT {worker_role(ledger.schema)} TO {role}` (and migrate, which grants every "
        "table to that role)"
    )
    try:
        ledger.open()
    except LedgerError as exc:
        checks.append(
            f"problem: ledger database: {type(exc).__name__}: {escape_controls(str(exc))}"
        )
        checks += [escape_controls(lacking)] if missing else []
        problems = len(checks)
        _emit(args, {"checks": checks, "findings": [], "problems": problems}, "\n".join(checks))
        return 1
    with ledger:
        checks += ["ok: database reachable", "ok: migrations current"]
        findings = ledger_findings(
            ledger, outbox_older_than_seconds=args.outbox_age, max_attempts=args.max_attempts
        )
    if missing:  # the whole list as a check line (a table cell is cut at 80 characters)
        checks.append(escape_controls(lacking))
        grant = f"GRANT {worker_role(ledger.schema)} TO {role}"
        detail = f"role {role} lacks {len(missing)} privilege(s) workers need: {grant}"
        findings.insert(0, Finding("missing_privilege", "problem", escape_controls(detail)))
    else:
        checks.append(f"ok: role {escape_controls(role)} has every privilege workers need")
    return _print_findings(args, findings, checks)


def _retention_policies(
    args: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[list[tuple[str, "RetentionPolicy"]], list[str]]:
    """(identity job name, policy) to prune by, and what was matched: each job's spec policy in
    the code location, with the command line's overrides; ``--job`` by Dagster or identity job
    name (unknown: exit 2). Without a code location, the overrides alone, for the ``--job``
    identity names given or every job in the ledger."""
    from idempotent_jobs.core.retention import RetentionPolicy
    from idempotent_jobs.operator.code_location import CodeLocationError

    try:
        workspace = _workspace(args)
    except CodeLocationError as exc:
        if not overrides:
            raise CodeLocationError(
                f"{exc.reason}; or give the parts to prune on the command line "
                "(--raw-input-days, --output-days, --attempts-days, --outbox-days)"
            ) from None
        with _ledger(args) as ledger:
            names = list(args.job or ledger.job_names())
        policy = RetentionPolicy().overridden(**overrides)
        return [(name, policy) for name in dict.fromkeys(names)], [
            "no code location: the command line's retention for identity jobs "
            + (", ".join(names) or "(none in the ledger)")
        ]
    if args.job:
        matches = [workspace.find_job(name) for name in args.job]
        specs = [m.spec for m in matches]
        said = [f"job: {m.describe()}" for m in matches]
    else:
        specs, said = workspace.specs, [f"jobs of {workspace.describe()}"]
    policies = [(s.identity_job_name, s.retention.overridden(**overrides)) for s in specs]
    return list(dict(policies).items()), said


def _prune(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from idempotent_jobs.core.retention import PART_TABLES, PARTS, describe_kept, prune

    days = {
        "raw_input": args.raw_input_days,
        "output": args.output_days,
        "attempts": args.attempts_days,
        "delivered_payloads": args.outbox_days,
    }
    overrides = {part: timedelta(days=d) for part, d in days.items() if d is not None}
    policies, said = _retention_policies(args, overrides)
    with _ledger(args) as ledger:
        reports = [
            prune(ledger, name, policy, apply=args.apply, batch_size=args.batch_size)
            for name, policy in policies
            if policy.prunes_anything
        ]
    rows = [
        (
            report.job_name,
            PART_TABLES[part],
            report.parts[part].rows,
            human_bytes(report.parts[part].bytes),
            describe_kept(getattr(report.policy, part)),
        )
        for report in reports
        for part in PARTS
        if getattr(report.policy, part) is not None
    ]
    kept_all = [name for name, policy in policies if not policy.prunes_anything]
    head = "pruned:" if args.apply else "dry run, nothing was pruned; with --apply these would go:"
    lines = [
        *map(escape_controls, said),
        head,
        table(["job", "part", "rows", "bytes", "kept for"], rows),
    ]
    lines.append(
        f"{sum(r.rows for r in reports)} rows, {human_bytes(sum(r.bytes for r in reports))} "
        f"in {sum(r.batches for r in reports)} batches of at most {args.batch_size}, "
        f"{sum(r.seconds for r in reports):.1f} s"
    )
    if kept_all:
        lines.append(
            f"kept whole (no retention policy): {escape_controls(', '.join(kept_all))}; "
            "--raw-input-days, --output-days, --attempts-days, --outbox-days set one"
        )
    _emit(args, reports, "\n".join(lines))
    return 0


def _reconcile(args: argparse.Namespace) -> int:
    import dagster as dg

    from idempotent_jobs.dagster.health import dagster_findings, drift_findings, ledger_findings
    from idempotent_jobs.operator.dagster_home import prepare_dagster_home

    workspace = _workspace(args)
    if args.job:
        match = workspace.find_job(args.job)
        specs, said = [match.spec], f"job: {match.describe()}"
    else:
        specs = workspace.specs
        said = f"jobs: {', '.join(s.name for s in specs) or 'none'} ({workspace.describe()})"
    if not specs:
        raise InvalidInputError(
            "--job",
            f"no job of {workspace.describe()} was built by "
            "idempotent-jobs (build_idempotent_job): nothing to reconcile",
        )
    ensure_database_url()
    home = prepare_dagster_home()
    with _ledger(args) as ledger, dg.DagsterInstance.from_config(str(home)) as instance:
        findings = (
            dagster_findings(ledger, instance, specs)
            + ledger_findings(
                ledger, outbox_older_than_seconds=args.outbox_age, max_attempts=args.max_attempts
            )
            + drift_findings(ledger, specs, workspace.configs(specs))
        )
    return _print_findings(args, findings, [escape_controls(said)])


def _revise(args: argparse.Namespace) -> int:
    """Everything that can be checked is checked before the one write (the revise itself)."""
    with _ledger(args) as ledger:
        run_id = ledger.resolve_run_id(args.run_id)
        record = ledger.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        if record.status != "completed":
            raise InvalidInputError(
                "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
            )
        partition = None
        if args.channel or args.now:
            from idempotent_jobs.operator.rerun import partition_for_run, rerun_partition

            workspace = _workspace(args)
            spec = workspace.spec_for_identity(record.job_name, record.version)
            unknown = [c for c in args.channel if c not in spec.channels]
            if unknown:
                raise InvalidInputError(
                    "--channel",
                    f"{', '.join(map(repr, unknown))} is not a channel of job {spec.name}; "
                    f"its channels: {', '.join(spec.channels) or 'none'}",
                )
            if args.now:
                partition = partition_for_run(workspace, record)
        record = ledger.revise(
            run_id,
            args.reason,
            channels=args.channel,
            recollect=args.recollect,
            requested_by=args.requested_by,
        )
        if partition is not None:
            try:
                rerun_partition(workspace, *partition)
            except Exception as exc:  # the revision stands; say so in one line
                print(
                    f"idempotent-jobs: run {record.run_id} is revised (revision "
                    f"{record.revision} recorded), but its recompute failed: "
                    f"{escape_controls(describe_error(exc))}",
                    file=sys.stderr,
                )
                return 1
            record = ledger.get(run_id) or record
    done = "recomputed" if args.now else "reopened"
    human = (
        f"run {record.run_id} {done} as revision {record.revision}: status={record.status}"
        f"\nnotify on completion: {escape_controls(', '.join(args.channel)) or 'no channel'}"
    )
    if not args.now:
        human += "\nlaunch its partition in Dagster (or pass --now) to recompute it"
    _emit(args, record, human)
    return 0


def _drill(args: argparse.Namespace) -> int:
    """Arm, end or list the ledger's failure drills; ``--job`` by Dagster or identity name."""
    job = "*"
    said = "every job"
    job_option = getattr(args, "job", None)
    if job_option:
        from idempotent_jobs.operator.code_location import CodeLocationError

        try:
            match = _workspace(args).find_job(job_option)
            job, said = match.spec.identity_job_name, match.describe()
        except CodeLocationError:  # no code location here: the name is the identity job name
            from idempotent_jobs.core.identity import normalize_text

            job = normalize_text(job_option)
            said = f"identity job {job}"
    with _ledger(args) as ledger:
        if args.drill_command == "fail-model-calls":
            drill = ledger.arm_drill(
                job, args.calls, args.expires_in, armed_by=os.environ.get("USER")
            )
            human = (
                f"the next {drill.remaining} model call(s) of {said} will fail, on every worker, "
                f"until {drill.expires_at:%Y-%m-%d %H:%M:%S %Z} (drill off ends it)"
            )
            _emit(args, drill, escape_controls(human))
            return 0
        if args.drill_command == "off":
            ended = ledger.disarm_drills(job if job_option else None)
            human = f"drill off for {said}" if ended else f"no drill was armed for {said}"
            _emit(args, ended, escape_controls(human))
            return 0
        drills = ledger.drills()
    rows = [(d.job_name, d.remaining, d.expires_at, d.armed_by) for d in drills]
    _emit(args, drills, table(["job", "calls left", "expires", "armed by"], rows))
    return 0


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotent-jobs",
        description="Scheduled AI jobs that are safe to run more than once. The database is "
        "IDEMPOTENT_JOBS_DATABASE_URL, or an embedded PostgreSQL when it is unset.",
    )
    parser.add_argument("--schema", default="idempotent_jobs", help="ledger schema name")
    where = parser.add_argument_group(
        "code location (for reconcile, revise --channel/--now, outbox deliver, prune, dev; "
        "default: $IDEMPOTENT_JOBS_CODE_LOCATION=module[:attribute], else the project's "
        "[tool.dagster] or workspace.yaml, as dagster dev finds them)"
    )
    where.add_argument("-m", "--module-name", help="module holding your Dagster Definitions")
    where.add_argument("-f", "--python-file", help="Python file holding your Definitions")
    where.add_argument("-a", "--attribute", help="the Definitions' name in that module or file")
    where.add_argument("-w", "--workspace", help="a Dagster workspace.yaml")
    parser.add_argument(
        "--connect-timeout",
        type=_positive(float, 3600.0),
        default=10.0,
        help="seconds to wait for the database (libpq counts whole seconds: rounded up)",
    )
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="machine-readable output")
    health = argparse.ArgumentParser(add_help=False)
    health.add_argument(
        "--outbox-age",
        type=_positive(float, MAX_SECONDS, zero=True),
        default=900.0,
        help="seconds after which an undelivered notification is a problem",
    )
    health.add_argument(
        "--max-attempts",
        type=_positive(int),
        default=3,
        help="a failed run with this many attempts is a problem",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("migrate", help="create or upgrade the ledger schema").set_defaults(
        handler=_migrate
    )
    demo = commands.add_parser("demo", help="run the demo and show the ledger")
    demo.add_argument(
        "--any-database",
        action="store_true",
        help="run it on the configured database too (by default only on the embedded one, so "
        "it never touches another deployment's runs)",
    )
    demo.set_defaults(handler=_demo)

    db = commands.add_parser(
        "db", help="the project's embedded PostgreSQL: url, env, status, stop, psql"
    ).add_subparsers(dest="db_command", required=True)
    db.add_parser("url", help="its URL (starts it if needed)").set_defaults(handler=_db("db_url"))
    db.add_parser(
        "env", help='export lines for plain `dagster dev`: eval "$(idempotent-jobs db env)"'
    ).set_defaults(handler=_db("db_env"))
    db.add_parser("status", help="running or not, and where").set_defaults(handler=_db("db_status"))
    db.add_parser("stop", help="stop it (the data stays)").set_defaults(handler=_db("db_stop"))
    psql = db.add_parser("psql", help="psql on the ledger database")
    psql.add_argument("psql_args", nargs=argparse.REMAINDER, help="passed on to psql")
    psql.set_defaults(handler=_db("db_psql"))
    dev = commands.add_parser("dev", help="the Dagster UI and daemon wired to the ledger")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=_positive(int, 65535), default=3000)
    dev.set_defaults(handler=_dev)

    runs = commands.add_parser("runs", help="logical runs in the ledger").add_subparsers(
        dest="runs_command", required=True
    )
    listing = runs.add_parser("list", parents=[json_flag], help="list runs")
    listing.add_argument(
        "--job", help="identity job name (e.g. competitor-summary) or Dagster job name"
    )
    listing.add_argument("--subject")
    listing.add_argument("--status", choices=["pending", "running", "completed", "failed"])
    listing.add_argument("--since", type=_when, help="window start >= this (ISO, with zone)")
    listing.add_argument("--until", type=_when, help="window start < this (ISO, with zone)")
    listing.add_argument("--limit", type=_positive(int), default=100)
    listing.add_argument(
        "--after", help="continue after this run (id or prefix): the previous page's last run"
    )
    listing.set_defaults(handler=_runs_list)
    show = runs.add_parser("show", parents=[json_flag], help="one run: attempts, outbox")
    show.add_argument("run_id", help="run id (or a unique prefix)")
    runs.add_parser(
        "stats",
        parents=[json_flag],
        help="rows and bytes per job and table (estimated from a sample on big tables)",
    ).set_defaults(handler=_runs_stats)
    show.set_defaults(handler=_runs_show)

    outbox = commands.add_parser("outbox", help="notifications").add_subparsers(
        dest="outbox_command", required=True
    )
    olist = outbox.add_parser("list", parents=[json_flag], help="list outbox rows")
    olist.add_argument("--pending", action="store_true", help="only undelivered rows")
    olist.add_argument("--run", help="only this run (id or prefix)")
    olist.add_argument("--limit", type=_positive(int), default=1000)
    olist.set_defaults(handler=_outbox_list)
    deliver = outbox.add_parser("deliver", parents=[json_flag], help="send pending rows")
    deliver.add_argument("--run", help="only this run (id or prefix)")
    deliver.add_argument("--limit", type=_positive(int), default=100)
    deliver.set_defaults(handler=_outbox_deliver)

    commands.add_parser(
        "doctor", parents=[json_flag, health], help="check the ledger; non-zero if unhealthy"
    ).set_defaults(handler=_doctor)
    reconcile = commands.add_parser(
        "reconcile", parents=[json_flag, health], help="compare the ledger with Dagster's runs"
    )
    reconcile.add_argument(
        "--job", help="Dagster job name or identity job name (default: all jobs)"
    )
    reconcile.set_defaults(handler=_reconcile)

    revise = commands.add_parser(
        "revise", parents=[json_flag], help="recompute a completed run (kept in history)"
    )
    revise.add_argument("run_id", help="run id (or a unique prefix)")
    revise.add_argument("--reason", required=True, help="why the accepted result is replaced")
    revise.add_argument(
        "--channel",
        action="append",
        default=[],
        help="notify this channel of the new result (repeatable; default none)",
    )
    revise.add_argument("--recollect", action="store_true", help="collect the input again")
    revise.add_argument("--requested-by", default=None, help="who asks (kept in history)")
    revise.add_argument(
        "--now", action="store_true", help="recompute now, running the partition in this process"
    )
    revise.set_defaults(handler=_revise)

    pruning = commands.add_parser(
        "prune",
        parents=[json_flag],
        help="drop old payloads by each job's retention policy (a dry run unless --apply)",
        description=(
            "Runs keep their rows forever (they make a rerun a no-op); their raw input, output, "
            "attempt rows and delivered notification payloads go after the job's retention "
            "policy, in batches, while the jobs run. Without --apply, only counts."
        ),
    )
    pruning.add_argument(
        "--job", action="append", help="a job (Dagster or identity name; repeatable; default all)"
    )
    pruning.add_argument("--apply", action="store_true", help="prune (default: a dry run)")
    pruning.add_argument(
        "--batch-size", type=_positive(int), default=5000, help="rows per transaction"
    )
    for flag, what in (
        ("--raw-input-days", "raw inputs"),
        ("--output-days", "accepted outputs"),
        ("--attempts-days", "attempt rows"),
        ("--outbox-days", "delivered notification payloads"),
    ):
        pruning.add_argument(
            flag,
            type=_positive(float, MAX_DAYS),
            help=f"keep {what} this many days (overrides the job's)",
        )
    pruning.set_defaults(handler=_prune)

    drill = commands.add_parser(
        "drill", help="failure drills that need no code change (kept in the ledger)"
    ).add_subparsers(dest="drill_command", required=True)
    drill_job = argparse.ArgumentParser(add_help=False)
    drill_job.add_argument("--job", help="Dagster or identity job name (default: every job)")
    fail = drill.add_parser(
        "fail-model-calls",
        parents=[json_flag, drill_job],
        help="make the next N model calls fail before the call, on every worker",
    )
    fail.add_argument("calls", type=_positive(int), help="how many model calls fail")
    fail.add_argument(
        "--expires-in",
        type=_positive(float, MAX_SECONDS),
        default=3600.0,
        help="seconds after which the drill ends by itself (default: 3600)",
    )
    fail.set_defaults(handler=_drill)
    drill.add_parser("list", parents=[json_flag], help="the drills armed now").set_defaults(
        handler=_drill
    )
    drill.add_parser("off", parents=[json_flag, drill_job], help="end the drill").set_defaults(
        handler=_drill
    )
    return parser


def _fail(exc: BaseException) -> int:
    """One line on stderr, exit 2: the error's type and text, controls escaped, no password."""
    from idempotent_jobs.core.database import redact

    text = redact(str(exc), os.environ.get(DATABASE_URL_ENV))
    print(f"idempotent-jobs: {type(exc).__name__}: {escape_controls(text)}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import psycopg

    try:
        code: int = args.handler(args)
    except (LedgerError, psycopg.Error) as exc:
        return _fail(exc)
    return code


if __name__ == "__main__":
    sys.exit(main())
