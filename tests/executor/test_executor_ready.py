"""Restarts on a busy machine: a rank shortens its process-group timeouts to --pg-timeout only
after every rank has resumed (or finished a checkpoint save), so a peer slowed by the machine's
load is waited for with the setup timeout, never taken for a hang (issue 18: a resume that
"timed out after 4 s" on a loaded 2-core machine)."""

import argparse
import inspect
import re

import pytest

torch = pytest.importorskip("torch")

from executor import worker  # noqa: E402


def test_timeouts_shorten_only_after_a_barrier_of_every_rank(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "set_timeouts", lambda s: calls.append(("timeouts", s)))
    monkeypatch.setattr(worker.Worker, "barrier", lambda self, device, group: calls.append(("barrier", group)))
    w = worker.Worker.__new__(worker.Worker)
    w.args = argparse.Namespace(pg_timeout=4.0)
    w.all_ready(torch.device("cpu"))
    assert calls == [("barrier", None), ("timeouts", 4.0)]  # the world group, then the short timeout


def test_no_rank_shortens_its_timeouts_without_the_barrier():
    source = inspect.getsource(worker.Worker)
    short = re.findall(r"set_timeouts\(self\.args\.pg_timeout\)", source)
    assert len(short) == 1 and "def all_ready" in source
    assert source.count("self.all_ready(device)") == 4  # after resume and after a save, workers and servers
