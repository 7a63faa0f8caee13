"""The reference scripts' PyPI packages (pyref_requirements.txt), in build/pyref/.venv.

ensure("tokenizers") returns when the running interpreter can import the modules; otherwise it
creates the venv if needed, installs the pinned requirements there and re-runs the script with it.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).resolve().parent / "pyref_requirements.txt"


def ensure(*modules):
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return
    venv = REPO / "build" / "pyref" / ".venv"
    python = venv / "bin" / "python"
    if Path(sys.prefix).resolve() == venv.resolve():
        sys.exit(f"{', '.join(modules)} missing from {venv} after installing {REQUIREMENTS}")
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    subprocess.check_call([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)])
    os.execv(str(python), [str(python), *sys.argv])
