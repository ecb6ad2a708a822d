"""The ledger's SQL files: every statement named, explained, used by its own face only, fenced and
cacheable."""

import re
from importlib import resources
from pathlib import Path

import pytest
from psycopg import _queries

from idempotent_jobs.core import sql as sql_package
from idempotent_jobs.core import stores as stores_package
from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.sql import (
    FACES,
    STORES,
    Face,
    face_statements,
    parse_statements,
    positional,
    store_statements,
)
from idempotent_jobs_tests.ledgers import harness_statements

#: Every statement of both faces and of the tests' harness (a name both faces hold is the same
#: read, written twice: each face's file is whole on its own).
STATEMENTS = {
    **face_statements("worker"),
    **face_statements("admin"),
    **harness_statements(),
}
STORES_FOLDER = Path(stores_package.__file__).resolve().parent
_USED = re.compile(r'(?:(?:_db|executor)\.(?:fetch|rows|query)|_fenced)\(\s*"([a-z_]+)"')

# Writes that are not fenced by a lease, and why each may not be.
UNFENCED_WRITES = {
    "register": "creates or touches the run row; takes no lease",
    "begin": "takes the lease (register + claim)",
    "claim": "takes the lease when it is free",
    "revise": "an operator reopens a completed run, which has no lease",
    "mark_delivered": "the outbox row is locked FOR UPDATE SKIP LOCKED by its deliverer",
    "mark_delivery_failed": "the outbox row is locked FOR UPDATE SKIP LOCKED by its deliverer",
    "prune_batch": "retention: completed runs and delivered outbox rows only, never leased",
    "arm_drill": "an operator arms a drill; it touches no run",
    "disarm_drills": "an operator ends a drill; it touches no run",
    "take_drill": "the drill row is locked FOR UPDATE; it touches no run",
    "declare_budgets": "the budgets a job's spec declares; it touches no run",
    "set_budget": "an operator sets a budget; it touches no run",
    "clear_budget": "an operator removes a budget; it touches no run",
    "set_price": "an operator sets a model's price; it touches no run",
    "delete_prices": "an operator removes a model's prices; it touches no run",
    "settle_doubt": "an operator settles a call in doubt with the provider's figure; the call "
    "is recorded already and its run's state is not touched",
    "fail_by_caller": "fenced by the Dagster run that claimed the lease, while running: a step "
    "that failed outside its body (an IO manager) holds no lease object to fence with",
    "store_step_output": "the ledger IO manager's hand-over between Dagster steps, keyed by the "
    "Dagster run and step that produced it; it touches no run",
    "prune_step_outputs": "retention: hand-overs of completed runs only, never leased",
    "prune_spend": "retention: spend rows of periods no budget counts any more, never leased",
    "record_lost_call": "only the cost of a call whose lease was lost, never the run's state; "
    "only for an epoch the ledger recorded as this worker's",
    "declare_rate_limit": "the provider limit a job's workers keep; it touches no run",
    "set_rate_limit": "an operator sets a provider's rate limit; it touches no run",
    "delete_rate_limit": "an operator removes a provider's rate limit; it touches no run",
    "open_batch": "opens a new batch under its first lease; it touches no run",
    "request_batch_cancel": "an operator asks for a batch to be cancelled (its lane does it under "
    "its lease); it touches no run",
    "claim_batch": "takes the batch's lease when it is free (bumping its epoch), and extends only "
    "the leases the batch holds on its pending runs (owner batch:<id>, at their epochs)",
    "create_shadow": "an operator starts a shadow and chooses its runs; it touches no run",
    "claim_shadow": "takes the shadow's lease when it is free (bumping its epoch); no run",
}
#: A shadow's writes, each fenced by the shadow's own lease; none writes a run (a promotion
#: writes runs only through revise and the fenced commit).
SHADOW_FENCED = {
    "renew_shadow",
    "release_shadow",
    "shadow_to",
    "shadow_start_submit",
    "record_shadow_call",
    "end_shadow_item",
    "judge_shadow_item",
    "mark_item_promoted",
}
#: The batch lane's writes, each fenced by the batch's own lease (its owner and epoch).
BATCH_FENCED = {
    "add_batch_items",
    "renew_batch",
    "start_submit",
    "record_submitted",
    "record_duplicate",
    "record_batch_status",
    "fail_batch_intent",
    "end_batch_item",
    "finish_batch",
    "release_batch",
    "batch_cancel_sent",
    "give_back_strays",
    "discard_batch_intent",
    "end_batch_step",
}
_WRITE = re.compile(
    r"\b(INSERT INTO|UPDATE|DELETE FROM)\s+\{schema\}\.|\{schema\}\.(declare_spec_budgets|"
    r"declare_spec_rate_limit|prune_spend|settle_doubt)\(",
    re.IGNORECASE,
)
_FENCE = (
    "lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s",
    "status = 'running'",
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_every_write_after_a_claim_carries_the_owner_and_epoch_fence() -> None:
    writes = {name for name, s in STATEMENTS.items() if _WRITE.search(s.text)}
    assert set(UNFENCED_WRITES) <= writes
    fenced = writes - set(UNFENCED_WRITES) - BATCH_FENCED - SHADOW_FENCED
    for name in sorted(SHADOW_FENCED):  # fenced by the shadow's lease
        text = _one_line(STATEMENTS[name].text)
        assert re.search(
            r"(\w+\.)?lease_owner = %\(worker_id\)s AND (\w+\.)?lease_epoch = %\(epoch\)s", text
        ), name
        assert "UPDATE {schema}.runs" not in text, name
    for name in sorted(BATCH_FENCED):  # fenced by the batch's lease
        text = _one_line(STATEMENTS[name].text)
        assert re.search(
            r"(\w+\.)?lease_owner = %\(worker_id\)s AND (\w+\.)?lease_epoch = %\(epoch\)s", text
        ), name
        # A run row is written only under the lease the batch holds on it.
        for where in re.findall(r"UPDATE \{schema\}\.runs .*? WHERE (.*?)(?: RETURNING |$)", text):
            assert "lease_owner = 'batch:' ||" in where and "lease_epoch = i.lease_epoch" in where
    assert fenced == {
        "admit_request",
        "renew",
        "save_raw_input",
        "complete",
        "fail",
        "release",
        "record_answer",
        "record_turn",
    }
    for name in sorted(fenced):
        text = _one_line(STATEMENTS[name].text)
        if not re.search(r"UPDATE \{schema\}\.runs", text):  # an insert that follows a claim
            for part in _FENCE:
                assert part in text.replace("r.", ""), (name, part)
            continue
        # Each UPDATE of a run row in the statement is fenced; inserts only follow from it.
        # Each UPDATE of a run row in the statement is fenced, either in its own WHERE or by
        # the `mine` of the row it read under lock (the statements that say what happened).
        mine = re.search(r"COALESCE\((.*?), false\) AS mine", text) or re.search(
            r"\((\w+ = %\(worker_id\)s AND .*?)\) IS TRUE AS mine", text
        )
        wheres = re.findall(r"UPDATE \{schema\}\.runs .*? WHERE (.*?)(?: RETURNING |$)", text)
        assert wheres, name
        for where in wheres:
            fence = where.replace("r.", "")
            if re.search(r"\b\w+\.mine\b", where):
                assert mine is not None, name
                fence = mine[1]
            for part in _FENCE:
                assert part in fence, (name, part)


@pytest.mark.parametrize("store", STORES)
def test_each_store_module_runs_its_own_files_statements_and_uses_every_one(store: str) -> None:
    """A store's module (``core/stores/<store>.py``) names only statements of its own file
    (``sql/<store>.sql``), and every statement there is used."""
    module = STORES_FOLDER / f"{store}.py"
    own = {name for name, s in store_statements().items() if s.store == store}
    assert set(_USED.findall(module.read_text(encoding="utf-8"))) == own
    for name in own:
        assert STATEMENTS[name].purpose.endswith("."), name
        assert not STATEMENTS[name].text.rstrip().endswith(";"), name


@pytest.mark.parametrize("face", FACES)
def test_a_face_refuses_the_other_faces_statements_by_name(face: Face) -> None:
    other: Face = "admin" if face == "worker" else "worker"
    only_mine = sorted(set(face_statements(face)) - set(face_statements(other)))
    for name in only_mine[:3]:
        with pytest.raises(KeyError, match=f"the {other} face has no statement"):
            Executor(LedgerSettings("postgresql://unused"), other).query(name)


def test_no_other_module_runs_a_statement() -> None:
    package = STORES_FOLDER.parents[1]
    others = [p for p in sorted(package.rglob("*.py")) if p.parent != STORES_FOLDER]
    for path in others:
        assert not _USED.findall(path.read_text(encoding="utf-8")), path


def test_a_name_both_faces_hold_is_the_same_read() -> None:
    shared = set(face_statements("worker")) & set(face_statements("admin"))
    assert shared == {
        "get_shadow",
        "shadow_items",
        "shadow_gate",
        "get_run",
        "list_model_calls",
        "ledger_currency",
        "list_outbox",
        "list_rate_limits",
    }
    for name in shared:
        # written once, in its store's file, for both faces
        assert face_statements("worker")[name] is face_statements("admin")[name], name
        assert face_statements("worker")[name].faces == frozenset(FACES), name
        assert not _WRITE.search(face_statements("worker")[name].text), name


def test_each_store_owns_one_file_of_at_most_400_lines_and_a_statement_is_written_once() -> None:
    folder = resources.files(sql_package)
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    assert files == sorted(f"{store}.sql" for store in STORES)
    for name in files:
        lines = folder.joinpath(name).read_text(encoding="utf-8").count("\n")
        assert lines <= 400, (name, lines)
    every = store_statements()
    assert {s.store for s in every.values()} == set(STORES)
    assert set(every) == set(face_statements("worker")) | set(face_statements("admin"))


def test_a_faces_line_names_real_faces_and_a_name_is_defined_once() -> None:
    one, two = "-- name: a\n-- Purpose.\nSELECT 1\n", "-- name: b\n-- Purpose.\nSELECT 2\n"
    parsed = parse_statements(f"-- faces: admin\n{one}-- faces: worker admin\n{two}")
    assert parsed["a"].faces == {"admin"} and parsed["b"].faces == {"worker", "admin"}
    with pytest.raises(ValueError, match="names no face"):
        parse_statements("-- faces: worker cook\n" + one)
    with pytest.raises(ValueError, match="defined twice"):
        parse_statements(one + one)


def test_no_string_literal_spans_lines() -> None:
    """The loader drops each line's indentation; that changes no value only while every
    literal (and quoted identifier) opens and closes on one line."""
    for statement in STATEMENTS.values():
        for line in statement.text.splitlines():
            code = line.split("--", 1)[0]
            assert code.count("'") % 2 == 0 and code.count('"') % 2 == 0, (statement.name, line)


def test_a_named_statement_is_numbered_in_postgresqls_own_form() -> None:
    """What the executor sends through psycopg's ``RawCursor``: no parsing at each execute,
    whatever the statement's length (psycopg's cache of parsed queries stops at 4,096 bytes)."""
    text, names = positional("SELECT %(a)s, %(b)s::int, %(a)s || 'x%%y' FROM t WHERE c = %(c)s")
    assert text == "SELECT $1, $2::int, $1 || 'x%y' FROM t WHERE c = $3"
    assert names == ("a", "b", "c")
    with pytest.raises(ValueError, match="no %"):
        positional("SELECT 'a' LIKE 'b%'")


def test_every_statement_is_numbered_with_each_of_its_names() -> None:
    settings = LedgerSettings("postgresql://unused@127.0.0.1:9/x", schema="s" * 63)
    for face in FACES:
        executor = Executor(settings, face)
        for name in face_statements(face):
            query = executor.query(name)
            text, names = positional(query)
            assert "%" not in text or "%%" in query, name
            assert set(names) == set(re.findall(r"%\(([a-z_0-9]+)\)s", query)), name
            assert len(re.findall(r"\$\d+", text)) == len(re.findall(r"%\(", query)), name


def test_the_statements_run_by_name_outside_fetch_fit_psycopgs_query_cache() -> None:
    """A statement a store runs itself (``self._db.query(name)`` on a connection of its own:
    the outbox's delivery, in pipeline mode) is parsed by psycopg, not numbered by the
    executor: each must stay under the cache's limit, or it is parsed again at every execute.
    Found in the package's source, rendered with the longest schema name."""
    package = Path(sql_package.__file__).resolve().parents[1]
    used = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r'_db\.query\("([a-z_]+)"\)', path.read_text(encoding="utf-8"))
    }
    assert {"lock_undelivered", "mark_delivered"} <= used  # the search finds the outbox's
    settings = LedgerSettings("postgresql://unused@127.0.0.1:9/x", schema="s" * 63)
    executor = Executor(settings, "worker")
    for name in sorted(used):
        assert len(executor.query(name)) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name
    assert len(executor.query("begin")) > 4096  # written out whole, as psycopg's cache would not


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("-- name: a\nSELECT 1", "no one-line purpose"),
        ("-- name: a\n-- Purpose.\n", "is empty"),
        ("-- name: a\n-- P.\nSELECT 1\n-- name: a\n-- P.\nSELECT 2", "defined twice"),
    ],
)
def test_a_malformed_statement_file_is_refused(source: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_statements(source)


def test_statements_are_parsed_whole() -> None:
    parsed = parse_statements("-- header\n\n-- name: one\n-- Does one.\n-- More.\nSELECT 1;\n")
    assert list(parsed) == ["one"]
    assert (parsed["one"].purpose, parsed["one"].text) == ("Does one.", "SELECT 1")
