"""No module-level cache: what lives as long as a ledger (a renewer, a cache of its budgets or
limits) is kept on that ledger (``LedgerFace.process_local`` or its stores), so two ledgers in
one process never share it and a dropped ledger takes it with it. A module may hold constants
only; the one process-wide record below is named with its reason."""

import ast
from pathlib import Path

import idempotent_jobs

PACKAGE = Path(idempotent_jobs.__file__).resolve().parent
MUTABLE = {"dict", "set", "list", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}
#: Process-wide on purpose, with why.
ALLOWED = {
    # A telemetry failure is warned about once per process, place and kind, whatever ledger.
    "core/telemetry.py:_failures_reported",
    # So is an engine observer's failure (core/observers.py), whatever ledger it watched.
    "core/observers.py:_failures_reported",
}


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in MUTABLE
    return False


def _is_state(name: str) -> bool:
    """A name that may hold state: not a CONSTANT, not a dunder (``__all__``)."""
    return not name.isupper() and not (name.startswith("__") and name.endswith("__"))


def module_state(path: Path) -> list[str]:
    """The module-level names of ``path`` bound to a mutable container (constants and dunders
    left out)."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets: list[ast.expr]
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and _is_state(target.id) and _mutable(value):
                found.append(target.id)
    return found


def test_no_module_of_the_package_keeps_state_at_module_level() -> None:
    found = {
        f"{path.relative_to(PACKAGE)}:{name}"
        for path in PACKAGE.rglob("*.py")
        for name in module_state(path)
    }
    assert ALLOWED <= found  # the check sees module state (this one is there)
    assert found - ALLOWED == set()


def test_the_check_finds_a_registry_keyed_by_ledger(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "import weakref\nCODES = {'a': 1}\n_by_ledger = weakref.WeakKeyDictionary()\n"
        "cache: dict[str, int] = {}\n"
    )
    assert module_state(sample) == ["_by_ledger", "cache"]
