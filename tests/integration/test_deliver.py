"""The invalidator's delivery (src/invalidator/deliver*.c, issue 14 point 3) against real shoal-nodes
and a shoal-router, without PostgreSQL: build/tests/deliver_drive takes commits on stdin and hands
them to delivery as the log reader would (see its header for the commands).

A cluster is made unreachable by stopping its node (SIGSTOP: connections hang, the data stays, so
the test can see every delete arrive once it is resumed)."""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, _die_with_parent, key_slot, pause_server, resume_server
from mcraw import McRaw, wait_until

def _drive_path():
    """SHOAL_DELIVER_DRIVE, else the deliver_drive of the build tree SHOAL_NODE_BIN comes from
    (build-san/bin/shoal-node -> build-san/tests/deliver_drive), else build/'s."""
    if "SHOAL_DELIVER_DRIVE" in os.environ:
        return REPO_ROOT / os.environ["SHOAL_DELIVER_DRIVE"]
    node = Path(os.environ.get("SHOAL_NODE_BIN", "build/bin/shoal-node"))
    tree = (node if node.is_absolute() else REPO_ROOT / node).parent.parent
    return tree / "tests" / "deliver_drive"


DRIVE = _drive_path()
DOWN_S = float(os.environ.get("SHOAL_DELIVER_DOWN_S", "10"))


class Drive:
    """deliver_drive with the given clusters ({name: [server, ...]}) and options."""

    def __init__(self, tmp_path, clusters, **opts):
        if not DRIVE.exists():
            pytest.fail(f"{DRIVE} not found: build it with `make unit-build` (or SAN=1)")
        self.tmp_path = tmp_path
        self.args = [str(DRIVE)]
        for name, servers in clusters.items():
            self.args += ["--cluster", name + "=" + ",".join(f"127.0.0.1:{s.port}" for s in servers)]
        opts.setdefault("spill_dir", str(tmp_path / "spill"))
        opts.setdefault("timeout_ms", 200)
        for k, v in opts.items():
            self.args += ["--" + k.replace("_", "-"), str(v)]
        self.start()

    def start(self):
        self.stderr = open(self.tmp_path / "drive.stderr", "a")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, preexec_fn=_die_with_parent)
        assert self.proc.stdout.readline().strip() == "ready", self.log()

    def log(self):
        return (self.tmp_path / "drive.stderr").read_text(errors="replace")

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def commit(self, lsn, *keys, more=False):
        assert self.ask(f"{'p' if more else 'c'} {lsn} {' '.join(keys)}") == "ok"

    def safe(self):
        return int(self.ask("s").split()[1])

    def wait_safe(self, lsn, ms=5000):
        got = self.ask(f"w {lsn} {ms}")
        assert got.startswith("safe"), f"safe LSN stuck at {got.split()[1]}, wanted {lsn}:\n{self.log()}"

    def metrics(self):
        self.proc.stdin.write("m\n")
        self.proc.stdin.flush()
        out = {}
        for line in iter(self.proc.stdout.readline, ""):
            line = line.strip()
            if line == "END":
                break
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def metric(self, name, cluster):
        return self.metrics().get(f'shoal_invalidator_cluster_{name}{{cluster="{cluster}"}}')

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        """Stop it; a problem (a non-zero exit, a sanitizer report) as text, else None."""
        if self.proc.poll() is not None:
            self.stderr.close()
            return None
        self.proc.stdin.write("q\n")
        self.proc.stdin.flush()
        status = self.proc.wait(10)
        self.stderr.close()
        if status != 0 or "Sanitizer" in self.log():
            return f"deliver_drive exited with status {status}:\n{self.log()}"
        return None


@pytest.fixture
def drive(tmp_path):
    started = []

    def make(clusters, **opts):
        d = Drive(tmp_path, clusters, **opts)
        started.append(d)
        return d

    yield make
    problems = [p for p in (d.stop() for d in started) if p]
    if problems:
        pytest.fail("\n".join(problems))


def fill(server, keys):
    with McRaw(server.host, server.port) as c:
        for k in keys:
            assert c.meta(f"ms {k} 1 T0", b"v").code == "HD"


def present(server, keys):
    with McRaw(server.host, server.port) as c:
        return [k for k in keys if c.meta(f"mg {k} v").code == "VA"]


@contextlib.contextmanager
def paused(server):
    """The server stopped (SIGSTOP: connections hang) for the block, resumed however it ends."""
    pause_server(server)
    try:
        yield
    finally:
        resume_server(server)


def commit_each(d, first_lsn, keys):
    """One commit per key, at LSNs first_lsn, first_lsn + 1, ..."""
    for i, k in enumerate(keys):
        d.commit(first_lsn + i, k)


def test_down_cluster_gets_every_delete_when_it_returns(start_server, drive):
    east, west = start_server(), start_server()
    keys = [f"user:{i}" for i in range(500)]
    fill(east, keys)
    fill(west, keys)
    d = drive({"east": [east], "west": [west]})
    with paused(west):
        t0 = time.monotonic()
        for i in range(0, 500, 5):
            d.commit(100 + i, *keys[i:i + 5])
        wait_until(lambda: not present(east, keys), message="east deleting everything meanwhile")
        assert d.safe() < 100 + 495, "the safe LSN passed deletes west has not applied"
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t0)))
    d.wait_safe(100 + 495, ms=10000)
    assert present(west, keys) == [], "deletes lost while the cluster was down"


def test_down_cluster_does_not_hold_another(start_server, drive):
    east, west = start_server(), start_server()
    d = drive({"east": [east], "west": [west]})
    with paused(west):
        keys = [f"k{i}" for i in range(200)]
        fill(east, keys)
        start = time.monotonic()
        commit_each(d, 10, keys)
        wait_until(lambda: not present(east, keys), timeout=2.0,
                   message="east taking every delete while west hangs")
        assert time.monotonic() - start < 2.0
        assert d.metric("up", "east") == 1


def test_spills_past_the_memory_bound_and_replays(start_server, drive, tmp_path):
    node = start_server()
    keys = [f"k{i}" for i in range(300)]
    fill(node, keys)
    d = drive({"east": [node]}, mem_max=2000)
    with paused(node):
        commit_each(d, 1000, keys)
        d.wait_safe(1299)  # durably spilled counts as safe while the cluster hangs
        assert d.metric("spilled_deletes", "east") > 0
        assert d.metric("buffered_bytes", "east") <= 2000 + 200
        assert (tmp_path / "spill" / "east.spill").stat().st_size > 0
    wait_until(lambda: not present(node, keys), timeout=10, message="spilled deletes replayed")
    wait_until(lambda: (tmp_path / "spill" / "east.spill").stat().st_size == 0,
               message="the spill file emptied once applied")


def test_restart_replays_leftover_spill_first(start_server, drive, tmp_path):
    node = start_server()
    keys = [f"k{i}" for i in range(100)]
    fill(node, keys)
    d = drive({"east": [node]}, mem_max=1)
    with paused(node):
        commit_each(d, 1000, keys)
        d.wait_safe(1099)
        d.kill()  # kill -9 of the invalidator after the spill
    d.start()
    assert d.safe() == 1099, "the leftover spill file counts as safe at start"
    wait_until(lambda: not present(node, keys), timeout=10, message="leftover spill replayed")


def test_backlog_past_spill_bound_becomes_flush_all(start_server, drive):
    node = start_server()
    bystander = [f"other:{i}" for i in range(20)]
    keys = [f"k{i}" for i in range(200)]
    fill(node, keys + bystander)
    d = drive({"east": [node]}, mem_max=1, spill_max=3000)
    with paused(node):
        commit_each(d, 1000, keys)
        d.wait_safe(1199)
        wait_until(lambda: d.metric("flush_replacements_total", "east") >= 1,
                   message="a flush replacing the spilled backlog")
    # the flush takes the keys no commit named with it: the whole cluster is flushed
    wait_until(lambda: not present(node, keys + bystander), timeout=10,
               message="flush_all applied after the cluster returns")
    assert "FLUSH" in d.log()


def test_replay_sends_a_slots_deletes_again(start_server, drive):
    node = start_server()
    keys = [f"item:{i}" for i in range(100)]
    d = drive({"east": [node]})
    commit_each(d, 10, keys)
    d.wait_safe(109)
    fill(node, keys)  # stale values cached again, e.g. from a lagging replica
    slot = key_slot("item:7")
    same = [k for k in keys if key_slot(k) == slot]
    got = d.ask(f"r east 60 {slot}")
    assert got == f"replayed {len(same)}"
    wait_until(lambda: not present(node, same), message="the slot's keys deleted again")
    assert set(present(node, keys)) == set(keys) - set(same), "keys of other slots were touched"


def test_keys_with_spaces_and_control_bytes_deleted_as_base64(cluster, drive):
    import base64
    raw_keys = [b"a b", b"tab\tkey", b"cr\rlf\nkey", b"caf\xc3\xa9"]
    with McRaw(cluster.router.host, cluster.router.port) as c:
        for k in raw_keys:
            assert c.meta(f"ms {base64.b64encode(k).decode()} 1 b T0", b"v").code == "HD"
    d = drive({"main": [cluster.router]})
    d.commit(10, *("".join(f"%{b:02x}" for b in k) for k in raw_keys))
    d.wait_safe(10)
    with McRaw(cluster.router.host, cluster.router.port) as c:
        for k in raw_keys:
            assert c.meta(f"mg {base64.b64encode(k).decode()} b v").code == "EN", k
    assert d.metric("keys_refused_total", "main") == 0


def test_through_a_router_every_node_gets_its_keys(cluster, drive):
    keys = [f"p:{i}" for i in range(300)]
    fill(cluster.router, keys)
    d = drive({"main": [cluster.router]}, batch_max=32)
    for i in range(0, 300, 10):
        d.commit(100 + i, *keys[i:i + 10])
    d.wait_safe(390)
    assert present(cluster.router, keys) == []
    for n in cluster.nodes:
        assert present(n, keys) == []
    assert d.metric("deletes_total", "main") == 300


def test_replica_served_cluster_waits_for_the_replay(start_server, drive):
    """Point 4: a cluster marked as served by a replica gets a commit's deletes only once that
    replica has replayed the commit, so its readers cannot refill the old row from it."""
    from pgreplica import PgReplicaPair, lsn_int
    node, other = start_server(), start_server()
    with PgReplicaPair() as pg:
        pg.primary("CREATE TABLE t (id int PRIMARY KEY, v text)")
        wait_until(lambda: pg.replica("SELECT count(*) FROM pg_class WHERE relname = 't'") == "1",
                   message="the table on the replica")
        d = drive({"region": [node], "local": [other]}, replica=f"region={pg.conninfo(pg.rport)}")
        pg.replica("SELECT pg_wal_replay_pause()")
        pg.primary("INSERT INTO t VALUES (1, 'new')")
        lsn = lsn_int(pg.primary("SELECT pg_current_wal_insert_lsn()"))
        fill(node, ["t:1"])
        fill(other, ["t:1"])
        d.commit(lsn, "t:1")
        wait_until(lambda: not present(other, ["t:1"]), message="the cluster without a replica")
        wait_until(lambda: d.metric("gated_deletes", "region") == 1,
                   message="region waiting for its replica")
        time.sleep(0.3)  # the replica lags on purpose: nothing may go meanwhile
        assert present(node, ["t:1"]) == ["t:1"], "deleted before the replica replayed the commit"
        assert d.safe() < lsn
        pg.replica("SELECT pg_wal_replay_resume()")
        pg.primary("INSERT INTO t VALUES (2, 'more')")  # WAL after it, so replay passes it
        wait_until(lambda: not present(node, ["t:1"]), timeout=10,
                   message="the delete once the replica replayed the commit")
        d.wait_safe(lsn)
        assert d.metric("replica_up", "region") == 1
        assert d.metric("replica_lsn", "region") >= lsn


def test_stalled_node_behind_router_holds_only_its_own_keys(start_server, start_router, drive,
                                                           tmp_path):
    """Behind a router, a stalled node's keys come back SERVER_ERROR while the other nodes' keys
    are deleted, later commits included: the failed keys go to the retry file (durable, so the
    safe LSN passes them) and are sent again from there until the node answers."""
    nodes = [start_server() for _ in range(3)]
    router, _, _ = start_router(nodes, "--timeout-ms", "100")
    keys = [f"r:{i}" for i in range(120)]
    later = [f"later:{i}" for i in range(30)]
    fill(router, keys + later)
    d = drive({"main": [router]}, timeout_ms=2000, batch_max=120)
    stalled = nodes[1]
    live = (nodes[0], nodes[2])
    with paused(stalled):
        d.commit(500, *keys)
        d.commit(600, *later)
        wait_until(lambda: not [k for n in live for k in present(n, keys + later)],
                   message="the live nodes' keys deleted, later commits too, while one node stalls")
        d.wait_safe(600)
        assert d.metric("retried_keys_total", "main") >= 1
        assert (tmp_path / "spill" / "main.retry").stat().st_size > 0
        assert d.metric("retry_deletes", "main") > 0
    wait_until(lambda: not present(stalled, keys + later), timeout=15,
               message="the stalled node's deletes once it answers")
    wait_until(lambda: (tmp_path / "spill" / "main.retry").stat().st_size == 0,
               message="the retry file emptied")
