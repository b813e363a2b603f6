"""The venv of Optimum for tests/decoder/test_gpt_dropin.py, from the pinned tests/clients/optimum-requirements.txt:
made once per requirements file under .cache/ (git-ignored), named by the file's sha256, complete once its stamp is
written. `make optimum` (a prerequisite of `make test`) makes it before pytest starts; the test's fixture makes it
when run without make.

    python tests/clients/optimum_venv.py    # prints the venv's python
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "tests" / "clients" / "optimum-requirements.txt"


class VenvError(RuntimeError):
    """The venv could not be made (pip's last lines)."""


def ensure() -> Path:
    """The python of the venv, made first if its stamp is missing."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    venv = REPO / ".cache" / f"optimum-{digest}"
    python = venv / "bin" / "python"
    if (venv / ".installed").is_file():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise VenvError(f"python -m venv {venv}: {made.stderr[-2000:]}")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                           str(REQUIREMENTS)], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise VenvError(f"pip install -r {REQUIREMENTS}: {done.stderr[-3000:]}")
    (venv / ".installed").touch()
    return python


if __name__ == "__main__":
    try:
        print(ensure())
    except VenvError as exc:
        sys.exit(str(exc))
