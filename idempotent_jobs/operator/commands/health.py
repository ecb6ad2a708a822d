"""``doctor`` (the ledger alone) and ``reconcile`` (the ledger against Dagster and the jobs)."""

import argparse
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError, LedgerError
from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    ensure_database_url,
    open_admin,
    print_findings,
)
from idempotent_jobs.operator.render import escape_controls


def doctor(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.grants import worker_role
    from idempotent_jobs.core.health import Finding, ledger_findings

    admin = open_admin(args)
    checks = []
    try:  # first, so a role without USAGE on the schema hears what it lacks
        role, missing = admin.missing_privileges()
    except LedgerError:
        role, missing = "", []  # no connection or no schema: opening says which, below
    lacking = (
        f"problem: role {role} lacks {', '.join(missing)}: as the schema's owner, "
        f"`GRANT {worker_role(admin.schema)} TO {role}` (and migrate, which grants every "
        "table to that role)"
    )
    try:
        admin.open()
    except LedgerError as exc:
        checks.append(
            f"problem: ledger database: {type(exc).__name__}: {escape_controls(str(exc))}"
        )
        checks += [escape_controls(lacking)] if missing else []
        problems = len(checks)
        emit(args, {"checks": checks, "findings": [], "problems": problems}, "\n".join(checks))
        return 1
    with admin:
        checks += ["ok: database reachable", "ok: migrations current"]
        findings = ledger_findings(
            admin, outbox_older_than_seconds=args.outbox_age, max_attempts=args.max_attempts
        )
    if missing:  # the whole list as a check line (a table cell is cut at 80 characters)
        checks.append(escape_controls(lacking))
        grant = f"GRANT {worker_role(admin.schema)} TO {role}"
        detail = f"role {role} lacks {len(missing)} privilege(s) workers need: {grant}"
        findings.insert(0, Finding("missing_privilege", "problem", escape_controls(detail)))
    else:
        checks.append(f"ok: role {escape_controls(role)} has every privilege workers need")
    with admin:
        abilities = admin.role_abilities()
    split = "the roles are split" if abilities.split else "the roles are not split"
    checks.append(f"ok: {escape_controls(abilities.describe())} ({split})")
    return print_findings(args, findings, checks)


def reconcile(args: argparse.Namespace) -> int:
    import dagster as dg

    from idempotent_jobs.dagster.health import dagster_findings, drift_findings, ledger_findings
    from idempotent_jobs.operator.dagster_home import prepare_dagster_home

    workspace = code_location(args)
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
    with open_admin(args) as admin, dg.DagsterInstance.from_config(str(home)) as instance:
        findings = (
            dagster_findings(admin, instance, specs)
            + ledger_findings(
                admin, outbox_older_than_seconds=args.outbox_age, max_attempts=args.max_attempts
            )
            + drift_findings(admin, specs, workspace.configs(specs))
        )
    return print_findings(args, findings, [escape_controls(said)])


def add_parser(commands: Any, shared: Shared) -> None:
    commands.add_parser(
        "doctor",
        parents=[shared.json_flag, shared.health],
        help="check the ledger; non-zero if unhealthy",
    ).set_defaults(handler=doctor)
    reconcile_parser = commands.add_parser(
        "reconcile",
        parents=[shared.json_flag, shared.health],
        help="compare the ledger with Dagster's runs",
    )
    reconcile_parser.add_argument(
        "--job", help="Dagster job name or identity job name (default: all jobs)"
    )
    reconcile_parser.set_defaults(handler=reconcile)
