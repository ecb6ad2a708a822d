"""Dagster's resource configuration errors in one line each.

Building a resource whose ``EnvVar`` is unset raises a ``DagsterInvalidConfigError`` whose text
holds a stack trace. An operator needs only which resource, which setting and which variable:
``resource 'report' (url): environment variable TEAM_REPORT_URL is not set``.
"""

import re
from pathlib import Path

import dagster as dg
import pydantic

_UNSET = re.compile(r'environment variable "([^"]+)" which is not set')
_PATH = re.compile(r"at path root:([^:\s]+)(?::config)?(?::([^\s]+))?")


def describe_resource_error(exc: BaseException) -> str:
    """One line for a failure to build resources: each unset variable named, with its
    resource and setting; else the first line of the error."""
    if isinstance(exc, dg.DagsterInvalidConfigError):
        parts = []
        for error in exc.errors:
            unset = _UNSET.search(error.message)
            path = _PATH.search(error.message)
            where = ""
            if path:
                setting = f" ({path.group(2)})" if path.group(2) else ""
                where = f"resource {path.group(1)!r}{setting}: "
            if unset:
                parts.append(f"{where}environment variable {unset.group(1)} is not set")
            else:
                parts.append(where + _first_line(error.message))
        if parts:
            return "; ".join(parts)
    invalid = validation_error(exc)
    if invalid is not None:
        return validation_text(invalid)
    return _first_line(str(exc))


def validation_text(invalid: pydantic.ValidationError) -> str:
    """Each field pydantic refused, and why, in one line: ``retry.max_retries (defs.yaml:14):
    ...``. The alternatives a field also accepts (a template string in a component's YAML) are
    left out when the field has a reason of its own."""
    reasons: dict[str, list[tuple[bool, str]]] = {}
    for error in invalid.errors():
        located = ".".join(str(part) for part in error["loc"])
        path, _, at = located.partition(" at ")  # a component's: "attributes.x.y at file:line"
        parts = [p for p in path.split(".") if p and not _type_tag(p)]
        if parts[:1] == ["attributes"]:
            parts = parts[1:]
        alternative = path.split(".")[-1:] == ["str"] and len(parts) > 0
        if alternative and parts[-1:] == ["str"]:
            parts = parts[:-1]
        field = ".".join(parts) or "value"
        if at:
            field += f" ({Path(at.rsplit(':', 1)[0]).name}:{at.rsplit(':', 1)[-1]})"
        reasons.setdefault(field, []).append((alternative, error["msg"]))
    lines = []
    for field, found in reasons.items():
        own = [msg for alternative, msg in found if not alternative]
        base = field.split(" (")[0]
        if not own and any(f.startswith(base + ".") for f in reasons):
            continue  # only "or a template string" where a field inside it has a reason
        lines.append(f"{field}: {'; '.join(own or [m for _, m in found])}")
    return "; ".join(lines)


def _type_tag(part: object) -> bool:
    """A location part that names a type pydantic tried (``RetryDecl``, ``constrained-float``,
    ``int``), not a field."""
    text = str(part)
    return "-" in text or text[:1].isupper() or text in ("str", "int", "float", "bool", "list")


def validation_error(exc: BaseException) -> pydantic.ValidationError | None:
    """The pydantic error behind ``exc`` (a component's attributes, a resource's settings),
    which names each field and its reason."""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, pydantic.ValidationError):
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())
