"""Reports open in a real browser: headless Chromium (Debian's `chromium`, installed by
scripts/test) loads each HTML file from disk with the network off, 1,280 px wide, and the
test reads what the page did and shows over the DevTools protocol: console messages,
uncaught exceptions, blocked loads (the report's Content-Security-Policy turns any network
fetch into a logged error), where each picture's hover marks and reference lines landed
(inside it), and whether any picture or table is wider than its box. A full-page
screenshot of each report is saved under ./artifacts/ for people to look at.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bstar.cli import main

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,  # starts Chromium for each report
    pytest.mark.skipif(CHROMIUM is None and os.environ.get("BSTAR_REQUIRE_BROWSER") != "1",
                       reason="chromium is not installed (scripts/test installs it)"),
    # A chart whose legend or labels squeeze its axes to nothing is a broken picture.
    pytest.mark.filterwarnings("error:constrained_layout not applied:UserWarning"),
]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-port=0", "--window-size=1400,1000"]

PLOTS_JS = """(() => [...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  const r = (svg || f).getBoundingClientRect();
  const inside = g => { const b = g.getBoundingClientRect(), x = (b.left + b.right) / 2,
                              y = (b.top + b.bottom) / 2;
                        return (b.width > 0 || b.height > 0) && x >= r.left
                               && x <= r.right && y >= r.top && y <= r.bottom; };
  const tips = svg ? [...svg.querySelectorAll('g[id^="tip-"]')] : [];
  const marks = svg ? [...svg.querySelectorAll('g[id^="mark-"]')] : [];
  return {name: f.dataset.plot, x: r.left + window.scrollX, y: r.top + window.scrollY,
          width: r.width, height: r.height, right: r.right, viewport: window.innerWidth,
          tooltips: svg ? svg.querySelectorAll('title').length : 0,
          tips: tips.length, tips_inside: tips.filter(inside).length,
          marks: marks.length, marks_inside: marks.filter(inside).length};
}))()"""
# Each table's scrolling box: a table wider than its box scrolls sideways (a clipped column).
TABLES_JS = """(() => [...document.querySelectorAll('.table-wrap')].map(w => {
  const c = w.closest('details'); if (c) c.open = true;
  const t = w.querySelector('table');
  return {caption: (t.querySelector('caption') || {}).textContent
                   || (w.previousElementSibling || {}).textContent || '',
          columns: [...t.querySelectorAll('th')].map(h => h.textContent),
          scroll: w.scrollWidth, client: w.clientWidth};
}))()"""


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    page_width: int = 0
    screenshot: bytes = b""
    title: str = ""


class _Cdp:
    """A minimal DevTools-protocol client over one browser websocket (flat sessions)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.loaded = asyncio.Event()

    async def pump(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                fut = self.pending.pop(data["id"])
                if "error" in data:
                    fut.set_exception(RuntimeError(str(data["error"])))
                else:
                    fut.set_result(data.get("result", {}))
            elif "method" in data:
                self.events.append(data)
                if data["method"] == "Page.loadEventFired":
                    self.loaded.set()

    async def send(self, method: str, params: dict[str, Any] | None = None,
                   session: str | None = None) -> Any:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps(msg))
        return await asyncio.wait_for(fut, 30)


def _errors_from(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            out.append(f"console.{p['type']}: " + json.dumps(p.get("args", []))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            out.append(f"log {p['entry']['level']}: {p['entry'].get('text', '')[:500]}")
    return out


async def _render(path: Path, width: int = 1280) -> PageResult:
    import aiohttp

    user_dir = tempfile.mkdtemp(prefix="bstar-chromium-")
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={user_dir}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)
    try:
        assert proc.stderr is not None
        ws_url = ""
        while not ws_url:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            if not line:
                raise RuntimeError("chromium exited before its DevTools endpoint was up")
            if line.startswith("DevTools listening on "):
                ws_url = line.split(" on ", 1)[1].strip()
        drain = asyncio.create_task(proc.stderr.read())  # keep the pipe from filling
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(ws_url, max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            pump = asyncio.create_task(cdp.pump())
            target = await cdp.send("Target.createTarget", {"url": "about:blank"})
            attached = await cdp.send("Target.attachToTarget",
                                      {"targetId": target["targetId"], "flatten": True})
            s = attached["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                await cdp.send(f"{domain}.enable", session=s)
            await cdp.send("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 1000, "deviceScaleFactor": 1,
                            "mobile": False}, session=s)
            await cdp.send("Page.navigate", {"url": path.resolve().as_uri()}, session=s)
            await asyncio.wait_for(cdp.loaded.wait(), 60)
            res = PageResult()
            got = await cdp.send("Runtime.evaluate", {"expression": PLOTS_JS,
                                                      "returnByValue": True}, session=s)
            res.plots = got["result"]["value"]
            title = await cdp.send("Runtime.evaluate", {"expression": "document.title",
                                                        "returnByValue": True}, session=s)
            res.title = title["result"]["value"]
            got = await cdp.send("Runtime.evaluate", {"expression": TABLES_JS,
                                                      "returnByValue": True}, session=s)
            res.tables = got["result"]["value"]
            got = await cdp.send("Runtime.evaluate", {
                "expression": "document.documentElement.scrollWidth",
                "returnByValue": True}, session=s)
            res.page_width = int(got["result"]["value"])
            metrics = await cdp.send("Page.getLayoutMetrics", session=s)
            height = int(metrics["cssContentSize"]["height"])
            shot = await cdp.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
                session=s)
            res.screenshot = base64.b64decode(shot["data"])
            await asyncio.sleep(0.2)  # let late console events arrive
            res.errors = _errors_from(cdp.events)
            pump.cancel()
        drain.cancel()
        return res
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        shutil.rmtree(user_dir, ignore_errors=True)


def render(path: Path) -> PageResult:
    return asyncio.run(asyncio.wait_for(_render(path, WIDTH), 120))


WIDTH = 1280  # a laptop's window: every table and picture fits it without scrolling


def check_report(html: Path, expected_plots: list[str], artifact: str) -> PageResult:
    """Open the report at WIDTH px and judge what it shows: no error, the pictures named, each
    with its hover marks and reference lines drawn inside it, nothing wider than the page,
    and every table within its box (no column cut off behind a scrollbar)."""
    res = render(html)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / artifact).write_bytes(res.screenshot)
    assert res.errors == [], res.errors
    assert [p["name"] for p in res.plots] == expected_plots
    svgs = re.findall(r'data-plot="([^"]+)".*?(<svg.*?</svg>)', html.read_text("utf-8"), re.S)
    drawn = {name: svg.count('<g id="tip-') for name, svg in svgs}
    for p in res.plots:
        assert p["tips"] == drawn[p["name"]] > 0, p  # every hover mark drawn is on the page
        assert p["tooltips"] == p["tips"], p  # each with its values
        assert p["tips_inside"] == p["tips"], p  # inside its picture, none clipped away
        assert p["marks_inside"] == p["marks"], p
        assert p["right"] <= WIDTH and p["width"] > WIDTH / 3, p
    assert res.page_width <= WIDTH
    for t in res.tables:
        assert t["scroll"] <= t["client"] + 1, t
    return res


def _chart_names(html: Path) -> list[str]:
    return re.findall(r'<figure class="plot" id="plot-[^"]+" data-plot="([^"]+)"',
                      html.read_text(encoding="utf-8"))


def test_plan_report_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    assert main(["report", "plan", "--max-tpot-ms", "20", "-o", str(out)]) == 0
    names = _chart_names(out)
    # Latency and throughput for each of the three default contexts, and the roofline.
    assert names == [f"{k}-{c}" for c in (512, 2048, 8192) for k in ("latency", "throughput")] \
        + ["roofline"]
    res = check_report(out, names, "report-plan.png")
    assert "llama-3-8b" in res.title


def test_compare_report_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "compare.html"
    assert main(["report", "compare", "--model", "llama-3-8b,llama-2-13b,llama-3-70b",
                 "--context", "512,2048,8192", "-o", str(out)]) == 0
    check_report(out, ["compare"], "report-compare.png")


def test_fit_report_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "fit.html"
    # Seed 001 is a 7B model on an H100: the report draws the fit beside that prediction.
    assert main(["report", "fit", str(ROOT / "examples" / "seed001.csv"), "--critical-batch",
                 "128", "--predict", "256,512", "--model", "llama-2-7b", "--gpu", "h100-sxm",
                 "-o", str(out)]) == 0
    check_report(out, ["fit", "signature"], "report-fit.png")


def test_simulate_report_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "sim.html"
    assert main(["report", "simulate", "--max-num-seqs", "16,64,256", "--concurrency", "200",
                 "--input-len", "512", "--output-len", "64", "--num-requests", "200",
                 "-o", str(out)]) == 0
    check_report(out, ["simulate"], "report-simulate.png")


@pytest.mark.slow  # starts the token server
def test_sweep_run_report_in_chromium(token_server: Any, tmp_path: Path) -> None:
    from test_report import stored_sweep

    db = tmp_path / "runs.db"
    sweep = stored_sweep(token_server, db)
    out = tmp_path / "run.html"
    assert main(["report", "run", sweep["run_id"], "--db", str(db), "-o", str(out)]) == 0
    check_report(out, ["signature", "sweep"], "report-sweep.png")


def test_demo_report_in_chromium(tmp_path: Path) -> None:
    """The demo's report (a stored demo run, as `bstar demo` writes it): its wide per-level
    table, with the calibrated and the uncalibrated predictions, fits 1,280 px."""
    from test_report import build_demo_run

    out = tmp_path / "demo.html"
    out.write_text(build_demo_run(tmp_path)["html"], encoding="utf-8")
    res = check_report(out, ["signature", "sweep", "fit"], "report-demo.png")
    per_level = next(t for t in res.tables if t["caption"].startswith("Per level"))
    assert "calibrated pred. tok/s (incl. prefill)" in per_level["columns"]
    assert "uncalibrated pred. tok/s (incl. prefill)" in per_level["columns"]


def test_a_network_fetch_is_caught(tmp_path: Path) -> None:
    """The check above can fail: a report that tries to load a remote image is reported
    (the policy blocks it and the browser logs the violation)."""
    out = tmp_path / "plan.html"
    assert main(["report", "plan", "--context", "512", "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    bad = tmp_path / "bad.html"
    bad.write_text(html.replace("<main>", '<main><img src="http://127.0.0.1:9/x.png">', 1),
                   encoding="utf-8")
    res = render(bad)
    assert res.errors, "a blocked network load went unnoticed"


def test_chromium_flags_match_the_documented_set() -> None:
    # scripts/test installs chromium; these flags keep it from reaching out on its own.
    for f in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
              "--disable-background-networking"):
        assert f in FLAGS
    assert subprocess.run([CHROMIUM or "chromium", "--version"], capture_output=True,
                          check=True).stdout.startswith(b"Chromium")
