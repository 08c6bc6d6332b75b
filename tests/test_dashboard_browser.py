"""The dashboard in headless Chromium (DevTools protocol): time to first paint and per knob
change, and issue 18's chart defects checked in the rendered page (plotly's SVG and the DOM),
with screenshots in a temporary folder (printed; kept with the test's tmp_path).

First paint: from the navigation to the step time on the page (the closed form's, drawn before
the discrete-event engine runs). Done: the script has finished (the event engine's numbers and
the timeline are drawn). A knob change is typed into the sidebar's number box like a user would.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMIUM, DevTools, chromium, dashboard, wait_until  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE_JS = """JSON.stringify({
  text: document.body ? document.body.innerText : "",
  state: (document.querySelector("[data-test-script-state]") || {dataset: {}}).dataset.testScriptState || "",
  metrics: Array.from(document.querySelectorAll('[data-testid="stMetric"]')).map(m => m.innerText),
  plots: Array.from(document.querySelectorAll(".js-plotly-plot")).map(p => (p.querySelector(".gtitle") || {}).textContent || "")
})"""

# geometry of one plotly chart, found by the start of its title
CHART_JS = """(() => {
  const plot = Array.from(document.querySelectorAll(".js-plotly-plot"))
    .find(p => ((p.querySelector(".gtitle") || {}).textContent || "").startsWith(%s));
  if (!plot) return null;
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = sel => Array.from(plot.querySelectorAll(sel));
  return JSON.stringify({
    svg: box(plot.querySelector(".main-svg")), title: box(plot.querySelector(".gtitle")),
    modebar: plot.querySelector(".modebar") ? box(plot.querySelector(".modebar")) : null,
    legend: plot.querySelector(".legend") ? box(plot.querySelector(".legend")) : null,
    legend_texts: all(".legendtext").map(e => e.textContent),
    annotations: all(".annotation-text").map(e => e.textContent),
    slices: all(".slicetext").map(e => ({text: e.textContent, box: box(e)})),
    bar_texts: all(".bartext").map(e => e.textContent),
    y2ticks: all(".y2tick text").map(e => e.textContent), yticks: all(".ytick text").map(e => e.textContent),
    rangeslider: all(".rangeslider-container").length,
    bars: all(".point").map(box), shapes: all(".shapelayer path").map(box)
  });
})()"""


class Page:
    def __init__(self, devtools: DevTools, shots: Path):
        self.dt, self.shots = devtools, shots

    def state(self) -> dict[str, Any]:
        return json.loads(self.dt.evaluate(PAGE_JS) or "{}")

    def chart(self, title_start: str) -> dict[str, Any] | None:
        out = self.dt.evaluate(CHART_JS % json.dumps(title_start))
        return json.loads(out) if out else None

    def step_time(self) -> str | None:
        return next((m.split("\n", 1)[1] for m in self.state().get("metrics", []) if m.startswith("Step time")), None)

    def wait_done(self, timeout: float = 180) -> dict[str, Any]:
        time.sleep(0.3)  # the rerun starts
        return wait_until(lambda: (s := self.state()).get("state") == "notRunning" and s, timeout,
                          "the page to finish", every=0.1)

    def type_number(self, label: str, value: int) -> None:
        """Type ``value`` into the sidebar number box named ``label`` and press Enter."""
        found = self.dt.evaluate(f"""(() => {{ const i = document.querySelector('input[aria-label={json.dumps(label)}]');
            if (!i) return false; i.focus(); i.select(); return true; }})()""")
        assert found, f"no number box {label!r}"
        self.dt.call("Input.insertText", {"text": str(value)})
        for kind in ("keyDown", "keyUp"):
            self.dt.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                    "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13})

    def click_text(self, selector: str, text: str) -> None:
        ok = self.dt.evaluate(f"""(() => {{ const e = Array.from(document.querySelectorAll({json.dumps(selector)}))
            .find(e => e.innerText.trim() === {json.dumps(text)}); if (!e) return false; e.click(); return true; }})()""")
        assert ok, f"nothing to click: {selector} {text!r}"

    def scroll_to_chart(self, title_start: str) -> None:
        self.dt.evaluate(f"""(() => {{ const p = Array.from(document.querySelectorAll(".js-plotly-plot"))
            .find(p => ((p.querySelector(".gtitle") || {{}}).textContent || "").startsWith({json.dumps(title_start)}));
            if (p) p.scrollIntoView({{block: "start"}}); }})()""")
        time.sleep(0.5)

    def shot(self, name: str) -> Path:
        data = self.dt.call("Page.captureScreenshot", {"format": "png"})["data"]
        path = self.shots / f"{name}.png"
        path.write_bytes(base64.b64decode(data))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return path


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(a: list[float], outer: list[float], slack: float = 1.0) -> bool:
    return a[0] >= outer[0] - slack and a[1] >= outer[1] - slack and a[2] <= outer[2] + slack and a[3] <= outer[3] + slack


def test_first_paint_knob_changes_and_chart_defects(chromium: DevTools, dashboard: str, tmp_path: Path) -> None:  # noqa: F811
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page = Page(chromium, shots)
    timings: dict[str, float] = {}

    # --- first paint: the step time is on the page; done: the event engine's timeline too -----
    t0 = time.monotonic()
    chromium.call("Page.navigate", {"url": dashboard})
    wait_until(page.step_time, 180, "the first step time", every=0.05)
    timings["first_paint_s"] = time.monotonic() - t0
    done = page.wait_done()
    timings["first_done_s"] = time.monotonic() - t0
    assert "Pipeline timeline" in done["text"] and "Traceback" not in done["text"]
    assert "engine discrete-event" in done["text"]
    page.shot("1-results")

    # --- the scenario's full name, not cut -----------------------------------------------------
    cut = chromium.evaluate("""(() => { const h = Array.from(document.querySelectorAll("h4"))
        .find(e => e.innerText.trim() === "gpt3-175b-1024xa100"); return h ? h.scrollWidth > h.clientWidth + 1 : null; })()""")
    assert cut is False

    # --- memory: the capacity named in the legend, not written over the bars --------------------
    memory = page.chart("Memory per stage")
    assert memory and any(t.startswith("GPU capacity 80 GiB") for t in memory["legend_texts"])
    assert not any("capacity" in a for a in memory["annotations"])
    bar_texts = page.chart("Where the")["bar_texts"]
    assert bar_texts and not any("e-" in t for t in bar_texts)

    # --- the timeline: the whole step with a range slider, and a caption of what is hidden ------
    timeline = page.chart("Pipeline timeline")
    assert timeline and timeline["rangeslider"] == 1
    assert "The whole step, 0 to" in done["text"] and "Drawn:" in done["text"]
    page.scroll_to_chart("Pipeline timeline")
    page.shot("2-timeline")

    # --- a knob change: tp 8 -> 4 (new: closed form first), back to 8 (cached) ------------------
    before = page.step_time()
    chromium.evaluate("window.scrollTo(0, 0)")
    for label, value, name in (("tp", 4, "knob_new_scenario"), ("tp", 8, "knob_cached_scenario")):
        previous = page.step_time()
        t1 = time.monotonic()
        page.type_number(label, value)
        wait_until(lambda previous=previous: (s := page.step_time()) and s != previous, 120, f"the step time after {label}={value}",
                   every=0.05)
        timings[f"{name}_paint_s"] = time.monotonic() - t1
        page.wait_done()
        timings[f"{name}_done_s"] = time.monotonic() - t1
    assert page.step_time() == before

    # --- out of memory: pp 16 -> 2, the capacity still clear of the bars ------------------------
    page.type_number("pp", 2)
    wait_until(lambda: "out of memory" in page.state()["text"], 120, "the out-of-memory badge", every=0.1)
    page.wait_done()
    memory = page.chart("Memory per stage")
    assert any(t.startswith("GPU capacity 80 GiB") for t in memory["legend_texts"])
    assert not any("capacity" in a for a in memory["annotations"])
    if memory["modebar"] and memory["modebar"][2] > memory["modebar"][0]:  # drawn: clear of the long title
        assert not overlaps(memory["modebar"], memory["title"]), (memory["modebar"], memory["title"])
    page.scroll_to_chart("Memory per stage")
    page.shot("3-out-of-memory")

    # --- the pie: rounded shares, no negligible slice, labels inside, legend clear of the title --
    chromium.evaluate("window.scrollTo(0, 0)")
    page.type_number("pp", 16)
    page.wait_done()
    page.click_text('[data-testid="stRadio"] label', "pie")
    page.wait_done()
    pie = wait_until(lambda: (c := page.chart("Where the")) and c["slices"] and c, 30, "the pie", every=0.2)
    assert all(re.fullmatch(r"\d+\.\d%", s["text"]) for s in pie["slices"]), pie["slices"]
    assert all(inside(s["box"], pie["svg"]) for s in pie["slices"])  # no label cut by the chart's edge
    assert pie["legend"] and not overlaps(pie["legend"], pie["title"])
    page.scroll_to_chart("Where the")
    page.shot("4-pie")

    # --- errors as written: tp*pp*cp keeps its asterisks ------------------------------------------
    chromium.evaluate("window.scrollTo(0, 0)")
    page.type_number("cp", 3)
    wait_until(lambda: "not valid" in page.state()["text"], 120, "the error", every=0.1)
    state = page.wait_done()  # the heading is drawn before the problems under it: wait for the run to end
    assert "tp*pp*cp" in state["text"], state["text"][:2000]
    page.shot("5-error")
    page.type_number("cp", 1)
    page.wait_done()

    # --- the sweep's MFU axis: round ticks ------------------------------------------------------
    wait_until(lambda: "What-if" in page.state()["text"], 60, "the tabs", every=0.2)
    page.click_text('[role="tab"]', "What-if")
    sweep = wait_until(lambda: (c := page.chart("Step time and MFU")) and c["y2ticks"] and c, 60, "the sweep",
                       every=0.2)
    ticks = [float(t.replace("\u2212", "-")) for t in sweep["y2ticks"] if t]
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1 and all(abs(t - round(t)) < 1e-9 for t in ticks), sweep["y2ticks"]
    assert "invalid" not in sweep.get("annotations", []) and "invalid point" not in page.state()["text"]
    page.scroll_to_chart("Step time and MFU")
    page.shot("6-sweep")

    report = json.dumps({k: round(v, 2) for k, v in timings.items()})
    (shots / "timings.json").write_text(report)  # the timings, beside the screenshots
