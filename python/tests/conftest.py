import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def _cli():
    """The cpsched tool to compare with: $CPSCHED_CLI, else a build of this tree, else PATH."""
    env = os.environ.get("CPSCHED_CLI")
    if env:
        return env
    for sub in ("release", "debug"):
        p = ROOT / "build" / sub / "bin" / "cpsched"
        if p.exists():
            return str(p)
    return shutil.which("cpsched")


@pytest.fixture(scope="session")
def cli():
    path = _cli()
    if not path:
        pytest.skip("no cpsched tool to compare with (build it, or set CPSCHED_CLI)")
    return path


@pytest.fixture(scope="session")
def quickstart():
    if not QUICKSTART.exists():
        pytest.skip("configs/quickstart.yaml is not beside the tests")
    return QUICKSTART
