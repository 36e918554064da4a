"""scripts/run.sh, the README's main job: a whole local cluster (`shoal up --foreground`:
shoal-control, three nodes, a gutter node and a router in front) on embedded defaults. Run here on free ports with the binaries already built
(SHOAL_NO_BUILD=1): keys written through the router land on their slot's node, every process
answers /healthz, Ctrl-C stops them all, and a process that dies takes the cluster down with a
message naming it."""

import os
import signal
import subprocess

import pytest

from conftest import REPO_ROOT, default_owner, key_slot
from mcraw import McRaw, accepts, free_port, free_port_block, http, wait_until

pytestmark = pytest.mark.shoal_only

OFFSETS = (1, 2, 3, 9)  # node1..node3, gutter: data at BASE+offset, admin 100 above


def free_base():
    """A base port whose node and admin ports (base+1..3, +9, +101..103, +109) are all free."""
    return free_port_block([o for o in OFFSETS] + [100 + o for o in OFFSETS])


@pytest.fixture
def cluster(tmp_path):
    base, port, admin, control = free_base(), free_port(), free_port(), free_port()
    env = dict(os.environ, SHOAL_NO_BUILD="1", SHOAL_BASE_PORT=str(base), SHOAL_PORT=str(port),
               SHOAL_ADMIN_PORT=str(admin), SHOAL_CONTROL_PORT=str(control),
               SHOAL_RUN_DIR=str(tmp_path / "run"),
               SHOAL_NODE_ARGS="-m 64",
               XDG_CONFIG_HOME=str(tmp_path / "config"))  # shoal up's token, not the user's
    log = open(tmp_path / "run.log", "w+")
    proc = subprocess.Popen([str(REPO_ROOT / "scripts/run.sh")], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def output():
        log.flush()
        return (tmp_path / "run.log").read_text()

    try:
        wait_until(lambda: "cluster is up" in output() or proc.poll() is not None, timeout=30,
                   message="run.sh to start the cluster")
        assert proc.poll() is None, f"run.sh exited at start:\n{output()}"
        yield proc, base, port, admin, output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # the daemons run in their own sessions: whatever run.sh left, shoal down stops
        subprocess.run([str(REPO_ROOT / "build/bin/shoal"), "down", "--dir", str(tmp_path / "run")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        log.close()


def test_cluster_serves_routes_and_stops(cluster):
    proc, base, port, admin, output = cluster
    nodes = [base + o for o in OFFSETS[:3]]
    out = output()
    for name in ("control", "node1", "node2", "node3", "gutter", "router"):
        assert name in out, f"the table lists {name}:\n{out}"

    with McRaw("127.0.0.1", port) as r:
        keys = [f"user:{i}" for i in range(40)]
        for k in keys:
            assert r.store("set", k, k.encode()) == "STORED"
        assert [item[2] for item in r.get(*keys)] == [k.encode() for k in keys]
    for k in keys:
        owner = nodes[default_owner(key_slot(k), 3)]
        for n in nodes:
            with McRaw("127.0.0.1", n) as direct:
                held = direct.meta(f"mg {k} v").code == "VA"
            assert held == (n == owner), f"{k} (slot {key_slot(k)}) on node :{n}"
    with McRaw("127.0.0.1", base + 9) as gutter:
        assert gutter.meta("mg user:0 v").code == "EN", "the gutter is idle while nodes are up"

    for p in [base + 100 + o for o in OFFSETS] + [admin]:
        status, _ = http(p, "GET", "/healthz")
        assert status == 200, f"/healthz on admin port {p}"

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends the foreground group
    assert proc.wait(timeout=15) == 0, output()
    for p in [base + o for o in OFFSETS] + [port]:
        assert not accepts(p), f"port {p} still open after the cluster stopped"


def test_a_dead_process_stops_the_cluster(cluster):
    proc, base, port, admin, output = cluster
    pid = int(next(line.split()[3] for line in output().splitlines()
                   if line.strip().startswith("node2 ")))
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=15) == 1
    wait_until(lambda: f"node2 (pid {pid}) was killed" in output(), message="the message naming node2")
    assert not accepts(port) and not accepts(base + 1), "the others were stopped"
