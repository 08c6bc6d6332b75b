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


def measurement(name: str = "local", scenario_hash: str = "abc123", step_time_s: float = 0.01,
                step_times_s: list[float] | None = None, **extra) -> dict:
    """A complete measurement JSON object, as `simdist run` writes it (phases not separated)."""
    times = step_times_s or [step_time_s]
    return {"name": name, "scenario_hash": scenario_hash, "world_size": 2, "device": "cpu", "backend": "gloo",
            "torch_version": "2.13.0", "steps": len(times), "step_time_s": step_time_s, "step_times_s": times,
            "losses": [10.0] * len(times),
            "phases_s": {"forward": None, "backward": None, "optimizer": None, "comm": None},
            "memory": {"peak_gib": 0.01, "per_rank": [{"rank": 0, "model_state_gib": 0.001,
                                                      "activations_gib": 0.002, "peak_gib": 0.01}]},
            **extra}


def run_cli(*args: str):
    """Run `simdist ARGS` in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "simdist.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (most torchrun launches: every plan kind, faults and restarts, the
    optimizer sweep, multi-node; the engine agreement on every bundled scenario; the browser
    timings; the README's long commands) run when asked for, as CI does: with any ``-m``
    expression (``-m slow``, ``-m distributed``, ...) or ``SIMDIST_SLOW=1``. The plain ``pytest``
    run leaves them out, so that it stays under ten minutes on a 2-core machine; it keeps a quick
    representative set of torchrun jobs (those not marked slow)."""
    if os.environ.get("SIMDIST_SLOW") or config.getoption("markexpr"):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]
