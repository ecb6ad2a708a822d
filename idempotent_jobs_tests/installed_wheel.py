"""The package as a user gets it: built as a wheel and installed, with its extras, into a
virtualenv of its own outside the repository (the docs' tests run their commands there, and the
rolling-upgrade test puts each release's code in one).

``uv`` builds and installs (a dev dependency): the same wheels and pins as pip, resolved from
its cache in seconds, where pip takes most of a minute per virtualenv. The virtualenv is seeded
with pip, which the docs' own commands use.
"""

import os
import subprocess
import sys
from pathlib import Path

import dagster

CHECKOUT = Path(__file__).resolve().parents[1]
#: What every docs test needs: Dagster and the embedded PostgreSQL, both model steps' SDKs, `dg`
#: and `create-dagster` at the Dagster version the package pins (the one installed here).
EXTRAS = "dagster,embedded,dg,openai,anthropic"
TOOLS = (f"create-dagster=={dagster.__version__}",)


def _uv(*args: str, timeout: float = 600) -> None:
    # Nothing of this process's PYTHONPATH: a checkout on it would pass for the installed package.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [sys.executable, "-m", "uv", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stderr[-3000:]}"


def install_wheel(
    root: Path, checkout: Path = CHECKOUT, extras: str = EXTRAS, tools: tuple[str, ...] = TOOLS
) -> Path:
    """Build ``checkout``'s wheel under ``root``, install it with ``extras`` (and ``tools``)
    into ``root/venv``; that venv's ``bin``."""
    wheels = root / "dist"
    _uv("build", "--quiet", "--wheel", "--out-dir", str(wheels), str(checkout))
    [wheel] = wheels.glob("idempotent_jobs-*.whl")
    home = root / "venv"
    _uv("venv", "--quiet", "--seed", "--python", sys.executable, str(home))
    python = str(home / "bin" / "python")
    _uv("pip", "install", "--quiet", "--python", python, f"{wheel}[{extras}]", *tools)
    return home / "bin"
