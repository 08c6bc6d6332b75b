"""The dashboard in a real browser: `streamlit run app.py` loaded in headless Chromium.

Streamlit renders client-side over a websocket. Chromium's `--dump-dom` with
`--virtual-time-budget` fast-forwards timers without waiting for websocket messages, so it
dumps the app's loading skeleton; this test therefore drives Chromium over the DevTools
protocol instead: navigate, poll the rendered page until the step time and the plotly charts
are there, read the DOM and take a screenshot (out/dashboard.png, 1400 x 1000).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

pytestmark = pytest.mark.browser
pytest.importorskip("streamlit")
pytest.importorskip("websockets.sync.client")  # a Streamlit dependency: the DevTools client

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)
SCREENSHOT = REPO / "out" / "dashboard.png"
STATE_JS = """JSON.stringify({
  text: document.body ? document.body.innerText : "",
  plots: document.querySelectorAll(".js-plotly-plot").length,
  state: (document.querySelector("[data-test-script-state]") || {dataset: {}}).dataset.testScriptState || ""
})"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a process group this test started: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_until(check: Any, timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[str]:
    """`streamlit run app.py` on a free port; killed at the end in all cases."""
    port = free_port()
    log = (tmp_path / "streamlit.log").open("wb")
    env = {**os.environ, "SIMDIST_DB": str(tmp_path / "runs.db")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: proc.poll() is not None or http_get(f"{url}/_stcore/health") == "ok", 90,
                   "the streamlit server")
        assert proc.poll() is None, (tmp_path / "streamlit.log").read_text()
        yield url
    finally:
        stop(proc)
        log.close()


class DevTools:
    """A minimal Chrome DevTools protocol client over the page's websocket."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[DevTools]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-allow-origins=*",
         "--window-size=1400,1000", "--hide-scrollbars", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 60, "chromium's DevTools port")
        port = port_file.read_text().split()[0]
        targets = wait_until(lambda: http_get(f"http://127.0.0.1:{port}/json/list"), 30, "the DevTools targets")
        page = next(t for t in json.loads(targets) if t.get("type") == "page")
        from websockets.sync.client import connect  # a Streamlit dependency

        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20) as ws:
            client = DevTools(ws)
            client.call("Page.enable")
            client.call("Runtime.enable")
            client.call("Emulation.setDeviceMetricsOverride",
                        {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
            yield client
    finally:
        stop(proc)


def test_dashboard_renders_in_chromium(chromium: DevTools, dashboard: str) -> None:
    chromium.call("Page.navigate", {"url": dashboard})

    def rendered() -> dict[str, Any] | None:
        state = json.loads(chromium.evaluate(STATE_JS) or "{}")
        ok = "Step time" in state.get("text", "") and state.get("plots", 0) >= 2 and state.get("state") == "notRunning"
        return state if ok else None

    state = wait_until(rendered, 120, "the step time and the charts", every=0.5)
    time.sleep(1.0)  # let plotly finish drawing before the screenshot
    dom = chromium.evaluate("document.documentElement.outerHTML")
    assert 'data-testid="stMetric"' in dom and "js-plotly-plot" in dom
    text = state["text"]
    assert "Step time" in text and "MFU" in text
    assert "Traceback" not in text and "Error" not in text.split("Step time")[0]

    shot = chromium.call("Page.captureScreenshot", {"format": "png"})
    SCREENSHOT.parent.mkdir(exist_ok=True)
    SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
    png = SCREENSHOT.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1400, 1000)
