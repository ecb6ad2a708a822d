"""Dagster's resource configuration errors in one line each.

Building a resource whose ``EnvVar`` is unset raises a ``DagsterInvalidConfigError`` whose text
holds a stack trace. An operator needs only which resource, which setting and which variable:
``resource 'report' (url): environment variable TEAM_REPORT_URL is not set``.
"""

import re

import dagster as dg

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
    return _first_line(str(exc))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())
