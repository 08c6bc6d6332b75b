from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# keep the tests' predictions and measurements out of the user's own run store
os.environ.setdefault("SIMDIST_DB", str(Path(tempfile.mkdtemp(prefix="simdist-test-")) / "runs.db"))

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))


@pytest.fixture
def repo() -> Path:
    return REPO


def base_scenario(**plan) -> dict:
    """A small valid scenario dict (GPT-3 1.3B on one DGX A100) to vary in tests."""
    return {
        "name": "t",
        "model": {"preset": "gpt3-1.3b"},
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "plan": {"global_batch_size": 64, **plan},
    }


def run_cli(*args: str):
    """Run `simdist ARGS` in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "simdist.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
