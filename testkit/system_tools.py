"""Debian tools the network tests need (PgBouncer, faketime, iproute2), installed when missing.

The tests never skip for a missing tool: as root on Debian (these machines, and CI) they install
it, as `make chromium` does for the browser; elsewhere they fail saying what to install.
"""

import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: executable -> the Debian package that provides it
PACKAGES = {"pgbouncer": "pgbouncer", "faketime": "faketime", "ip": "iproute2", "gcc": "gcc"}
_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
_install_lock = threading.Lock()


@contextmanager
def _installing() -> Iterator[None]:
    """One installer at a time on this machine: the threads of one process, and the processes
    of a parallel test run (two `apt-get install` at once: one fails on dpkg's lock)."""
    path = os.path.join(tempfile.gettempdir(), "idempotent-jobs-apt.lock")
    with _install_lock, open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def find(executable: str) -> str | None:
    found = shutil.which(executable)
    if found:
        return found
    for folder in _SBIN:
        path = os.path.join(folder, executable)
        if os.access(path, os.X_OK):
            return path
    return None


def require(*executables: str) -> dict[str, str]:
    """The paths of ``executables``, installing their Debian packages first when missing."""
    with _installing():
        missing = [e for e in executables if find(e) is None]
        if missing:
            packages = sorted({PACKAGES[e] for e in missing})
            if os.geteuid() != 0 or find("apt-get") is None:
                raise RuntimeError(
                    f"{', '.join(missing)} not found: install the Debian packages "
                    f"{' '.join(packages)} (apt-get install {' '.join(packages)})"
                )
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            install = ["apt-get", "install", "-y", "-qq", *packages]
            if subprocess.run(install, env=env, capture_output=True).returncode != 0:
                subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
                subprocess.run(install, env=env, check=True, capture_output=True, timeout=600)
    paths = {e: find(e) for e in executables}
    absent = [e for e, p in paths.items() if p is None]
    if absent:
        raise RuntimeError(f"installed, but still not found: {', '.join(absent)}")
    return {e: p for e, p in paths.items() if p is not None}


if __name__ == "__main__":  # `make tools`
    for name, path in require(*PACKAGES).items():
        print(f"{name}: {path}")
