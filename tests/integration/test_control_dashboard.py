"""shoal-control's dashboard (issue 13.6): GET /v1/stats reports every pool's nodes with their
health and slot ranges and each namespace's ops/s, hit ratio and memory over the last minutes,
sampled from real shoal-nodes' /metrics; GET / is the page, which loads Chart.js and its own
script from shoal-control itself, and in headless Chromium shows the pools table and live
figures that move under load.

The load is pymemcache on the nodes directly, with namespaced keys (`ns:key`). Samples are taken
every 200 ms here (--stats-interval-ms) so the figures move quickly; every wait is for a
condition."""

import os
import shutil
import threading
import time

import pytest
from pymemcache.client.base import Client

from mcraw import free_port, http, wait_until

MiB = 1 << 20
SLOTS = 16384
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def start_node(start_server):
    def start():
        admin_port = free_port()
        node = start_server("--admin-port", str(admin_port))
        node.admin_port = admin_port
        node.addr = f"127.0.0.1:{node.port}"
        node.admin = f"127.0.0.1:{admin_port}"
        return node
    return start


@pytest.fixture
def dash(start_control, start_node):
    """shoal-control sampling two real nodes of pool `main`, with namespace `catalog` pushed to
    them; (ctl, nodes)."""
    nodes = [start_node(), start_node()]
    ctl = start_control("--stats-interval-ms", "200", "--stats-window", "60")
    status, body = ctl.post("/v1/pools", {"name": "main", "nodes": [
        {"node": n.addr, "admin": n.admin} for n in nodes]})
    assert status == 201, body
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "memory": 32 * MiB})
    assert status == 201, body
    for n in nodes:  # the namespace is in place on every node before load goes to it
        wait_until(lambda n=n: http(n.admin_port, "GET", "/v1/namespaces/catalog")[0] == 200,
                   message=f"catalog pushed to {n.addr}")
    return ctl, nodes


class Load:
    """pymemcache traffic on `catalog` keys of every node, in a thread, until stopped: sets of
    a fixed key set, gets of those (hits) and of absent keys (misses)."""

    def __init__(self, nodes):
        self.nodes, self.stop_ev, self.ops = nodes, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        clients = [Client(("127.0.0.1", n.port), connect_timeout=2, timeout=2) for n in self.nodes]
        i = 0
        while not self.stop_ev.is_set():
            c = clients[i % len(clients)]
            c.set(f"catalog:k{i % 200}", b"v" * 200, noreply=False)
            c.get(f"catalog:k{i % 200}")
            c.get(f"catalog:absent{i}")
            i += 1
            self.ops += 3
        for c in clients:
            c.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join(5)


def stats(ctl, since=None):
    status, body = ctl.get("/v1/stats" + (f"?since={since}" if since is not None else ""))
    assert status == 200, body
    return body


def test_stats_lists_every_node_with_health_and_slot_ranges(dash):
    ctl, nodes = dash
    st = wait_until(lambda: (lambda s: s if all(n["health"] == "up" for n in
                                                 s["pools"]["main"]["nodes"]) else None)(stats(ctl)),
                    message="both nodes sampled up")
    got = st["pools"]["main"]["nodes"]
    assert [n["node"] for n in got] == [n.addr for n in nodes]
    assert [n["admin"] for n in got] == [n.admin for n in nodes]
    covered = sorted(tuple(r) for n in got for r in n["ranges"])
    assert covered[0][0] == 0 and covered[-1][1] == SLOTS - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:])), covered
    assert all(n["slots"] == sum(r[1] - r[0] + 1 for r in n["ranges"]) for n in got)
    assert sum(n["slots"] for n in got) == SLOTS
    assert all(isinstance(n["memory_limit"], int) and n["memory_limit"] > 0 for n in got)
    assert st["version"] == ctl.version()
    assert st["interval_ms"] == 200 and st["window_s"] == 60


def test_a_dead_node_is_down_with_the_reason_and_others_stay_up(start_control, start_node,
                                                                tmp_path):
    from conftest import launch
    live = start_node()
    admin_port = free_port()
    victim = launch("--admin-port", str(admin_port), tmp_dir=tmp_path)  # ours to kill
    try:
        addr, admin = f"127.0.0.1:{victim.port}", f"127.0.0.1:{admin_port}"
        ctl = start_control("--stats-interval-ms", "200")
        ctl.post("/v1/pools", {"name": "main", "nodes": [{"node": live.addr, "admin": live.admin},
                                                          {"node": addr, "admin": admin}]})

        def health():
            return {n["node"]: n for n in stats(ctl)["pools"]["main"]["nodes"]}
        wait_until(lambda: health()[addr]["health"] == "up", message="the victim sampled up")
        victim.proc.kill()
        victim.proc.wait()
        got = wait_until(lambda: (lambda h: h if h[addr]["health"] == "down" else None)(health()),
                         message="the killed node reported down")
        assert "refused" in got[addr]["error"] or "connect" in got[addr]["error"], got[addr]
        assert got[addr]["items"] is None
        assert got[live.addr]["health"] == "up"
        assert ctl.metrics()["shoal_control_stats_node_failures_total"] > 0
    finally:
        victim.stop()


def test_a_silent_node_costs_one_timeout_not_the_sample(start_control, start_node):
    """A node whose admin port accepts but never answers holds one worker for
    --stats-timeout-ms; samples go on at about that pace, the live node stays up."""
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", free_port()))
    silent.listen(64)
    live = start_node()
    ctl = start_control("--stats-interval-ms", "100", "--stats-timeout-ms", "300")
    ctl.post("/v1/pools", {"name": "main", "nodes": [
        {"node": live.addr, "admin": live.admin},
        {"node": "127.0.0.1:1", "admin": f"127.0.0.1:{silent.getsockname()[1]}"}]})
    try:
        first = wait_until(lambda: (lambda s: s if s["seq"] >= 2 else None)(stats(ctl)),
                           message="two samples")
        t0, seq0 = time.monotonic(), first["seq"]
        later = wait_until(lambda: (lambda s: s if s["seq"] >= seq0 + 5 else None)(stats(ctl)),
                           timeout=10, message="five more samples")
        per_sample = (time.monotonic() - t0) / (later["seq"] - seq0)
        assert per_sample < 0.3 * 2, f"{per_sample:.2f} s a sample with one silent node"
        health = {n["node"]: n["health"] for n in later["pools"]["main"]["nodes"]}
        assert health == {live.addr: "up", "127.0.0.1:1": "down"}
    finally:
        silent.close()


def test_namespace_figures_move_under_load(dash):
    ctl, nodes = dash
    wait_until(lambda: "catalog" in stats(ctl)["namespaces"], message="catalog sampled")
    quiet = stats(ctl)["namespaces"]["catalog"]
    assert quiet["pool"] == "main" and quiet["quota_bytes"] == 32 * MiB
    assert quiet["latest"]["ops_per_sec"] in (0, None)
    with Load(nodes):
        def busy():
            c = stats(ctl)["namespaces"]["catalog"]["latest"]
            return c if c["ops_per_sec"] and c["ops_per_sec"] > 50 and c["hit_ratio"] else None
        got = wait_until(busy, timeout=10, message="catalog's ops/s and hit ratio up under load")
        # every set key is read back once and one absent key per round: half the gets hit
        assert 0.3 < got["hit_ratio"] < 0.7, got
        assert got["memory_bytes"] > 0
        wait_until(lambda: stats(ctl)["namespaces"]["catalog"]["items"] >= 200,
                   message="catalog's items counted over both nodes")
    wait_until(lambda: stats(ctl)["namespaces"]["catalog"]["latest"]["ops_per_sec"] == 0,
               timeout=5, message="ops/s back to 0 once the load stops")


def test_series_cover_the_window_and_since_returns_only_newer_samples(dash):
    ctl, _ = dash
    full = wait_until(lambda: (lambda s: s if s["seq"] >= 3 and "catalog" in s["namespaces"]
                               else None)(stats(ctl)), message="three samples")
    n = len(full["times"])
    assert n == full["seq"] - full["first_seq"] + 1
    assert full["times"] == sorted(full["times"])
    for key in ("ops_per_sec", "hit_ratio", "memory_bytes"):
        assert len(full["namespaces"]["catalog"][key]) == n
    later = wait_until(lambda: (lambda s: s if s["seq"] > full["seq"] else None)(
        stats(ctl, since=full["seq"])), message="a newer sample")
    assert later["first_seq"] == full["seq"] + 1
    assert len(later["times"]) == later["seq"] - full["seq"]
    assert len(later["namespaces"]["catalog"]["ops_per_sec"]) == len(later["times"])
    status, body = ctl.get("/v1/stats?since=x")
    assert status == 400 and body["field"] == "since"


def test_the_window_is_bounded(start_control):
    ctl = start_control("--stats-interval-ms", "100", "--stats-window", "2")
    st = wait_until(lambda: (lambda s: s if s["seq"] > 25 else None)(stats(ctl)), timeout=10,
                    interval=0.2, message="more samples than the window holds")
    assert len(st["times"]) == 21  # 2 s of 100 ms samples, both ends included
    assert st["first_seq"] == st["seq"] - 20


def test_page_and_its_scripts_are_served_by_control_itself(start_control):
    ctl = start_control()
    status, page = ctl.get("/")
    assert status == 200 and "<html" in page
    assert 'src="/static/chart.js"' in page and 'src="/static/dash.js"' in page
    assert "http://" not in page and "https://" not in page  # nothing from a network
    status, js = ctl.get("/static/dash.js")
    assert status == 200 and "/v1/stats" in js
    if not os.path.exists("/usr/share/javascript/chart.js/chart.min.js"):
        pytest.skip("libjs-chart.js is not installed (scripts/deps.sh installs it)")
    status, chart = ctl.get("/static/chart.js")
    assert status == 200 and "Chart.js" in chart[:200]
    assert ctl.get("/static/nothing")[0] == 404


def test_without_chart_js_the_page_still_loads_and_chart_js_is_404(start_control, tmp_path):
    ctl = start_control("--chart-js", str(tmp_path / "missing.js"))
    assert ctl.get("/")[0] == 200
    status, body = ctl.get("/static/chart.js")
    assert status == 404 and "--chart-js" in body
    assert "Chart.js" in ctl.stderr_text()


# --- the page in headless Chromium -----------------------------------------------------------

def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        message = "chromium and chromium-driver are not installed (scripts/deps.sh installs them)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)  # CI installs them: absent there is a broken setup
        pytest.skip(message)
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="python3-selenium is not installed (scripts/deps.sh)")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def test_page_in_chromium_shows_nodes_slot_ranges_and_live_figures(dash):
    ctl, nodes = dash
    if not os.path.exists("/usr/share/javascript/chart.js/chart.min.js"):
        pytest.skip("libjs-chart.js is not installed (scripts/deps.sh installs it)")
    drv = browser()
    try:
        from selenium.webdriver.common.by import By
        drv.set_page_load_timeout(10)
        drv.get(f"http://127.0.0.1:{ctl.port}/")

        # the tables are rebuilt every refresh: read them whole, in one script call
        def rows():
            return drv.execute_script(
                "const out = {};"
                "for (const r of document.querySelectorAll('#pools-table tbody tr')) {"
                "  const f = k => r.querySelector('td[data-field=' + k + ']');"
                "  out[r.dataset.node] = {health: r.dataset.health, ranges: f('ranges').dataset.value,"
                "                         slots: f('slots').textContent};"
                "}"
                "return out;")
        wait_until(lambda: (lambda r: len(r) == 2 and all(x["health"] == "up" for x in r.values()))(
            rows()), timeout=10, message="both nodes up in the pools table")
        want = {n["node"]: n for n in stats(ctl)["pools"]["main"]["nodes"]}
        for addr, r in rows().items():
            assert r["ranges"] == ",".join(f"{a}-{b}" for a, b in want[addr]["ranges"])
            assert r["slots"] == str(want[addr]["slots"])
        assert drv.find_element(By.ID, "charts-missing").get_attribute("hidden") is not None
        assert drv.execute_script("return typeof Chart") == "function"

        def figure(field):
            v = drv.execute_script(
                "const c = document.querySelector("
                "  'tr[data-ns=catalog] td[data-field=' + arguments[0] + ']');"
                "return c ? c.dataset.value : '';", field)
            return float(v) if v else None

        def chart_ops():  # the ops/s line of catalog as drawn, and the sample it ends at
            return drv.execute_script(
                "const c = Chart.getChart('chart-ops');"
                "const d = c && c.data.datasets.find(x => x.label === 'catalog');"
                "return d ? [d.data.filter(v => v != null), c.canvas.dataset.seq] : null;")

        with Load(nodes):
            ops1 = wait_until(lambda: (figure("ops_per_sec") or 0) > 50 and figure("ops_per_sec"),
                              timeout=10, message="catalog's ops/s on the page under load")
            assert 0 < figure("hit_ratio") < 1
            assert figure("memory_bytes") > 0
            drawn1 = wait_until(lambda: (lambda c: c if c and any(v > 50 for v in c[0])
                                         else None)(chart_ops()),
                                timeout=10, message="catalog's ops/s line drawn")
            # live: the figures and the chart move on while load goes on
            wait_until(lambda: figure("ops_per_sec") not in (None, ops1), timeout=10,
                       message="catalog's ops/s figure changes")
            wait_until(lambda: (lambda c: c and int(c[1]) > int(drawn1[1]) and
                                len(c[0]) > len(drawn1[0]))(chart_ops()), timeout=10,
                       message="the chart drawn again with newer samples")
        for cid in ("chart-ops", "chart-ratio", "chart-memory"):
            assert int(drv.find_element(By.ID, cid).get_attribute("data-points")) > 0, cid
        logs = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs
    finally:
        drv.quit()
