"""Chrome/Perfetto traces: valid JSON, one process per rank, complete events in microseconds."""

from __future__ import annotations

import json
from pathlib import Path

from simdist.cli import main
from simdist.results import Span
from simdist.trace import chrome_trace, write_trace

SPANS = [
    Span(0, "compute", "F mb0 chunk0", 0.0, 1.5e-3, "forward"),
    Span(0, "pp", "sendrecv pp 6 MiB", 1.5e-3, 1.7e-3, "pp_comm"),
    Span(8, "compute", "F mb0 chunk0", 1.7e-3, 3.2e-3, "forward"),
    Span(8, "dp", "allreduce dp 25 MiB", 3.2e-3, 4.0e-3, "dp_comm"),
]


def test_chrome_trace_format() -> None:
    data = json.loads(json.dumps(chrome_trace(SPANS, stage_of=lambda r: r // 8)))
    events = data["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0 (stage 0)", 8: "rank 8 (stage 1)"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(0, "compute"), (0, "pp"), (8, "compute"), (8, "dp")}
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(SPANS)
    first = xs[0]
    assert first["name"] == "F mb0 chunk0" and first["ts"] == 0.0
    assert abs(first["dur"] - 1500.0) < 1e-9  # microseconds
    assert {e["tid"] for e in xs if e["pid"] == 0} == {1, 3}  # compute, pp threads


def test_write_trace_atomic(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "t.json"
    assert write_trace(out, SPANS) == 4
    assert json.loads(out.read_text())["traceEvents"]
    assert [p.name for p in out.parent.iterdir()] == ["t.json"]  # no temporary left behind


def test_trace_command(tmp_path: Path, capsys) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: small-3d\n"
        "model: {preset: gpt3-1.3b}\n"
        "cluster: {preset: dgx-a100-80gb, num_nodes: 2}\n"
        "plan: {tp: 4, pp: 2, global_batch_size: 16}\n"
    )
    out = tmp_path / "trace.json"
    assert main(["trace", str(scenario), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    data = json.loads(out.read_text())
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0 (stage 0)", 4: "rank 4 (stage 1)"}
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 and isinstance(e["ts"], float) for e in xs)
    assert {"forward", "backward", "pp_comm", "dp_comm", "optimizer"} <= {e["cat"] for e in xs}

    full = tmp_path / "full.json"
    assert main(["trace", str(scenario), "-o", str(full), "--fidelity", "full"]) == 0
    pids = {e["pid"] for e in json.loads(full.read_text())["traceEvents"] if e["name"] == "process_name"}
    assert pids == set(range(16))
