"""The /dashboard page in a real browser: headless Chromium, driven over
the DevTools protocol, loads the page from a running lmcached and we check
that it renders the server's numbers without console errors.  A screenshot
is kept in test-artifacts/dashboard.png.

Skipped only when no Chromium binary exists (the Makefile installs the
Debian package `chromium`, and `python3-websocket` for the protocol)."""
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from lmc.ops import NOOP
from lmc.server import ROOT, Server
from test_coordinator_api import start_coordinator  # noqa: F401 (fixture)

ARTIFACTS = os.path.join(ROOT, "test-artifacts")


def find_chromium():
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary found")


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self):
        import websocket  # python3-websocket (Debian)

        self.profile = tempfile.mkdtemp(prefix="lmc-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             "--remote-allow-origins=*", "--remote-debugging-port=0",
             "--window-size=1280,900", "--hide-scrollbars",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = self._browser_ws_url()
        page = self._page_ws_url(url)
        self.ws = websocket.create_connection(page, timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events = []

    def _browser_ws_url(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
        raise RuntimeError("Chromium did not start its DevTools endpoint")

    def _page_ws_url(self, browser_url):
        import urllib.request

        port = re.match(r"ws://[^:/]+:(\d+)/", browser_url).group(1)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise RuntimeError("Chromium has no page target")

    def call(self, method, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(expr):
                return True
            time.sleep(0.2)
        return False

    def errors(self):
        """Console errors, uncaught exceptions and failed loads seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(("console", [a.get("value", a.get("description")) for a in p["args"]]))
            elif e.get("method") == "Runtime.exceptionThrown":
                out.append(("exception", p["exceptionDetails"]))
            elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(("log", p["entry"].get("text"), p["entry"].get("url")))
        return out

    def screenshot(self, path):
        """The whole page, 1280 CSS pixels wide."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": 1280, "height": max(900, size["height"]), "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip,
                         captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)


def fmt_bytes(n):
    """The page's fmtBytes()."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def text(browser, elem_id):
    return browser.evaluate(f"document.getElementById({json.dumps(elem_id)}).textContent")


def open_dashboard(s):
    """A browser on s's /dashboard once its first poll is rendered."""
    browser = Browser()
    for domain in ("Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable")
    browser.call("Page.navigate", url=f"http://127.0.0.1:{s.http_port}/dashboard")
    assert browser.wait_for("document.getElementById('conn')?.textContent === 'Connected'"), \
        browser.errors()
    return browser


def test_generated_source_is_current():
    """dashboard_html.c must be what gen_dashboard.py makes of dashboard.html."""
    gen = os.path.join(ROOT, "src", "http", "gen_dashboard.py")
    assert subprocess.run([sys.executable, gen, "--check"]).returncode == 0, \
        "run: python3 src/http/gen_dashboard.py"


@needs_chromium
def test_dashboard_renders_status():
    s = Server()
    browser = None
    try:
        status = s.wait_l1_prefault()   # the L1's capacity is final from here on
        browser = open_dashboard(s)

        assert text(browser, "v-chunk_size") == f"{status['chunk_size']:,}"
        assert text(browser, "v-hash_algorithm") == status["hash_algorithm"]
        assert text(browser, "v-engine_type") == status["engine_type"]
        assert text(browser, "v-health") == "Healthy"
        assert text(browser, "health-badge") == "healthy"
        l1 = status["storage_manager"]["l1_manager"]
        assert browser.evaluate("document.getElementById('l1-capacity').dataset.bytes") == \
            str(l1["capacity"])
        assert text(browser, "l1-capacity") == fmt_bytes(l1["capacity"])
        assert text(browser, "l1-used") == fmt_bytes(l1["used"])
        assert text(browser, "v-l2") == "none"  # no L2 adapters in this build
        assert text(browser, "v-coord") == "off"  # no --coordinator-url
        assert status["p2p_enabled"] is False
        assert text(browser, "v-p2p") == "off"    # no --p2p-advertise-url
        assert text(browser, "s-p2p") == "no --p2p-advertise-url"
        assert browser.evaluate("document.querySelectorAll('#p2p-peers li').length") == 0
        assert text(browser, "v-l1-objects") == f"{l1['num_objects']:,}"
        # The hit-rate chart has its denominator from the first poll, before
        # any lookup: "no lookups yet", not "not reported" (issue 31).
        assert status["modules"]["lookup"]["requested_chunks"] == 0
        assert browser.wait_for("document.getElementById('note-hit').textContent"
                                ".startsWith('hit chunks ÷ requested chunks')"), \
            text(browser, "note-hit")
        sessions = status["modules"]["lookup"]["sessions"]
        assert text(browser, "v-sessions") == f"{sessions:,}"
        assert text(browser, "instance") == "instance " + status["instance_id"]
        # every module has a collapsible section; the raw tab holds the JSON
        for name in status["modules"]:
            assert browser.evaluate(
                "[...document.querySelectorAll('#modules summary')]"
                f".some((s) => s.textContent.includes({json.dumps(name)}))"), name
        raw = json.loads(text(browser, "raw"))
        assert raw["chunk_size"] == status["chunk_size"]

        # traffic between polls: the RPC chart gets points
        d = s.dealer()
        try:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                d.call(NOOP, timeout_ms=1000)
                time.sleep(0.02)
        finally:
            d.close()
        assert browser.wait_for(
            "document.querySelectorAll('#ch-rpc polyline').length === 1", timeout=10)
        assert browser.evaluate("document.querySelectorAll('#ch-l1 polyline').length") == 1

        os.makedirs(ARTIFACTS, exist_ok=True)
        shot = os.path.join(ARTIFACTS, "dashboard.png")
        browser.screenshot(shot)
        assert os.path.getsize(shot) > 10000

        # the other tabs render too
        browser.evaluate("document.querySelector('[data-tab=modules]').click()")
        browser.screenshot(os.path.join(ARTIFACTS, "dashboard-modules.png"))
        browser.evaluate("document.querySelector('[data-tab=storage]').click()")
        browser.screenshot(os.path.join(ARTIFACTS, "dashboard-storage.png"))

        assert browser.errors() == []
    finally:
        if browser:
            browser.close()
        rc = s.stop()
    assert rc == 0, s.output()


@needs_chromium
def test_dashboard_shows_the_coordinator_registration():
    from test_fleet_registrar import FakeCoordinator

    coord = FakeCoordinator()
    s = Server("--coordinator-url", coord.url, "--coordinator-heartbeat-interval", "0.3",
               "--instance-id", "mp-dash")
    browser = None
    try:
        coord.wait_for("heartbeat", 1)
        browser = Browser()
        for domain in ("Runtime", "Log", "Page"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{s.http_port}/dashboard")
        assert browser.wait_for("document.getElementById('v-coord')?.textContent === "
                                "'Registered'"), browser.errors()
        sub = text(browser, "s-coord")
        assert sub.startswith(f"mp-dash · {coord.url} · last heartbeat "), sub
        # The coordinator forgets us and refuses us: the page says so.
        coord.behaviour.update(heartbeat="404", register="500")
        assert browser.wait_for("document.getElementById('v-coord')?.textContent === "
                                "'Not registered'", timeout=15), browser.errors()
        assert browser.wait_for("document.getElementById('s-coord')?.textContent"
                                ".includes('HTTP 500')", timeout=15), text(browser, "s-coord")
        os.makedirs(ARTIFACTS, exist_ok=True)
        browser.screenshot(os.path.join(ARTIFACTS, "dashboard-coordinator.png"))
        assert browser.errors() == []
    finally:
        if browser:
            browser.close()
        rc = s.stop()
        coord.close()
    assert rc == 0, s.output()


@needs_chromium
def test_dashboard_says_degraded_with_the_reason():
    """Issue 31: an L2 backend that refuses connections leaves /healthcheck 200
    "degraded"; the page says Degraded and why, not Healthy nor Unhealthy."""
    from lmc.server import free_port, l2_args

    s = Server(*l2_args({"type": "resp", "host": "127.0.0.1", "port": free_port()}))
    browser = None
    try:
        browser = Browser()
        for domain in ("Runtime", "Log", "Page"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{s.http_port}/dashboard")
        assert browser.wait_for("document.getElementById('v-health')?.textContent === "
                                "'Degraded'"), (text(browser, "v-health"), browser.errors())
        assert text(browser, "health-badge") == "degraded"
        why = text(browser, "s-health")
        assert why.startswith("L2 adapter 0 (resp) unhealthy: ") and "refused" in why, why
        assert browser.errors() == []
    finally:
        if browser:
            browser.close()
        rc = s.stop()
    assert rc == 0, s.output()


@needs_chromium
def test_dashboard_p2p_tile(start_server, start_coordinator):
    """docs/http.md, "Dashboard": with P2P on, the P2P tile shows the
    discovery state, the peers and, per peer, what this server read from
    it; the locks held for peers come from the serving side."""
    from test_lookup_engine_driven import CS, OBJ, Worker, prompt
    from test_p2p_channel import l2_status, p2p_node, p2p_status, wait_for
    from lmc.client import lookup

    coord = start_coordinator()
    a, _ = p2p_node(start_server, coord, "node-a")
    b, _ = p2p_node(start_server, coord, "node-b")
    browser = None
    wa = Worker(a, 7001, 0, world_size=1)
    wb = Worker(b, 7002, 0, world_size=1)   # a lookup reaches L2 with a layout only
    try:
        toks = prompt(21)
        wa.store(toks, 0, 4 * CS)
        wait_for(lambda st: st["p2p_peer_count"] == 1, lambda: p2p_status(b))
        browser = open_dashboard(b)
        assert browser.wait_for("document.getElementById('v-p2p').textContent === "
                                "'Registered'"), text(browser, "v-p2p")
        assert text(browser, "s-p2p") == "1 peer · 0 locks held for peers"
        assert lookup(b, toks, "r1", cs=CS, world_size=1, wait=True) == 4
        peer = l2_status(b)["storage_manager"]["l2_adapters"][-1]["peers"][0]
        assert peer["hits"] >= 4 and peer["loaded_bytes"] >= 4 * OBJ
        want = (f"node-a · {peer['hits']:,} hits · {fmt_bytes(peer['loaded_bytes'])} read · "
                f"{peer['lookup_failures'] + peer['load_failures']} failures")
        row = "document.querySelector('#p2p-peers [data-peer=\"node-a\"]')?.textContent"
        assert browser.wait_for(f"{row} === {json.dumps(want)}"), browser.evaluate(row)
        # A's side of the same tile: what it holds locked for B until B unlocks.
        browser.close()
        browser = open_dashboard(a)
        wait_for(lambda st: st["leases_held"] == 0, lambda: l2_status(a)["modules"]["p2p_serve"])
        assert browser.wait_for("document.getElementById('s-p2p').textContent === "
                                "'1 peer · 0 locks held for peers'"), text(browser, "s-p2p")
        row_b = row.replace("node-a", "node-b")
        assert browser.wait_for(f"{row_b} === 'node-b · 0 hits · 0 B read · 0 failures'"), \
            browser.evaluate(row_b)
        os.makedirs(ARTIFACTS, exist_ok=True)
        browser.screenshot(os.path.join(ARTIFACTS, "dashboard-p2p.png"))
        # Older or partial field sets render as "–", never throw.
        shown = browser.evaluate("""(() => {
            const out = [];
            for (const st of [{p2p_enabled: true},
                              {p2p_enabled: true, p2p_state: 'unregistered', p2p_peers: [{}],
                               storage_manager: {l2_adapters: [{type_name: 'p2p', peers: null}]}},
                              {p2p_enabled: true, p2p_state: 'registered', p2p_peer_count: 1,
                               storage_manager: {l2_adapters: [{type_name: 'p2p',
                                 peers: [{instance_id: 'x', hits: 2}]}]}}]) {
              renderP2P(st);
              out.push([$('v-p2p').textContent, $('s-p2p').textContent,
                        [...document.querySelectorAll('#p2p-peers li')].map((l) => l.textContent)]);
            }
            return out; })()""")
        assert shown == [
            ["–", "0 peers · – locks held for peers", ["no peer discovered"]],
            ["Not registered", "1 peer · – locks held for peers", ["? · – hits · – read · – failures"]],
            ["Registered", "1 peer · – locks held for peers", ["x · 2 hits · – read · – failures"]]]
        assert browser.errors() == []
    finally:
        if browser:
            browser.close()
        wa.close()
        wb.close()
