"""The CLI's tables (rich): units in every header, plain ASCII on a pipe, colour on a terminal;
the predict report's wording (engine, HFU, model FLOPs, status column, offload and links in words)."""

import re

import pytest

from simdist import table as tables
from simdist.cli import main
from simdist.predict import predict
from simdist.spec.scenario import load_scenario

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_plain_on_a_pipe_and_colour_on_a_terminal(monkeypatch):
    rows = [[0, "1.00", "ok"], [1, "99.00", "OOM"]]
    plain = tables.table(["stage", "peak (GiB)", "fits GPU"], rows, align="rrl")
    assert not ANSI.search(plain) and plain.isascii()
    lines = plain.splitlines()
    assert lines[0].split() == ["stage", "peak", "(GiB)", "fits", "GPU"] and set(lines[1]) <= {"-", " "}
    assert lines[3].split() == ["1", "99.00", "OOM"]
    assert tables.table(["x"], [["[bold]not markup[/]"]]).splitlines()[-1] == "[bold]not markup[/]"
    monkeypatch.setattr(tables, "is_terminal", lambda: True)
    coloured = tables.table(["stage", "peak (GiB)", "fits GPU"], rows, align="rrl")
    assert ANSI.search(coloured) and "\x1b[1;31mOOM" in coloured  # bold red
    assert ANSI.sub("", coloured).split() == plain.split()  # the same table under the colour


def test_time_unit_is_one_per_column():
    assert tables.time_unit(125.0) == ("min", 60.0)
    assert tables.time_unit(0.5) == ("ms", 1e-3)
    assert tables.time_unit(0.0) == ("us", 1e-6)


def test_predict_report_says_what_each_figure_is(capsys):
    assert main(["predict", "scenarios/llama2-70b-zero3-offload-2xa100.yaml", "--no-store"]) == 0
    out = capsys.readouterr().out
    assert "engine des (discrete-event)" in out
    for header in ("step time (min)", "TFLOP/s/GPU (model FLOPs)", "MFU", "HFU (with recompute)",
                   "bubble (% of step)", "time (min)", "share of step", "params (GiB)", "reserved (GiB)",
                   "fits GPU"):
        assert header in out, header
    assert "offload: optimizer states in host memory; parameters in host memory;" in out
    assert "optimizer=cpu" not in out
    sc = load_scenario("scenarios/llama2-70b-zero3-offload-2xa100.yaml")
    p = predict(sc, engine="des", keep_spans=False)
    hfu = p.mfu * (1 + p.recompute_flops_per_step / p.model_flops_per_step)
    assert f"{hfu:.1%}" in out and hfu > p.mfu  # full recompute: hardware FLOPs above model FLOPs
    assert out.index("cost:") < out.index("assumptions:")


@pytest.mark.parametrize("link, words", [
    ("nic0.0~leaf0 down", "leaf switch 0 -> node 0's NIC 0 (downlink, nic0.0~leaf0 down)"),
    ("leaf3~spine up", "leaf switch 3 -> the spine (uplink, leaf3~spine up)"),
    ("gpu5~nvswitch0", "GPU 5 <-> node 0's NVSwitch (gpu5~nvswitch0)"),
    (3.5, "3.500")])
def test_links_in_words(link, words):
    assert tables.link_words(link) == words


def test_parameter_server_bottleneck_names_the_link_in_words():
    lines = tables.extras_lines({"parameter_servers": {"servers": 1, "bottleneck_link": "nic0.0~leaf0 down"}})
    assert lines == ["parameter_servers: servers=1, bottleneck_link=leaf switch 0 -> node 0's NIC 0 "
                     "(downlink, nic0.0~leaf0 down)"]
