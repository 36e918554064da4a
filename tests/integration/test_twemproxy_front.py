"""twemproxy (Debian's nutcracker) in front of shoal-nodes, as many memcached users run it.

Each scenario runs through a nutcracker that shards over two backends, once with two Debian
memcached processes behind it (the reference) and once with two shoal-nodes, and the outcomes
must be equal: the values read back, which operations succeeded, and that the connection kept
working after requests twemproxy passes on as they are (a refused store, a long multi-get).
"""

import os
import random
import shutil
import socket
import subprocess

import pytest
from pymemcache.client.base import Client

from conftest import _die_with_parent, _register, launch_memcached
from mcraw import McRaw, free_port, wait_until

NUTCRACKER = "/usr/sbin/nutcracker"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def front(request, tmp_path, start_server):
    """front(kind) -> port of a nutcracker over two backends of that kind (memcached|node)."""
    procs = []

    def make(kind):
        if not os.path.exists(NUTCRACKER) and shutil.which("nutcracker") is None:
            message = "nutcracker not installed (scripts/deps.sh installs it)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        backends = []
        for _ in range(2):
            if kind == "memcached":
                s = launch_memcached(tmp_path)
                _register(request.node, s)
            else:
                s = start_server()
            backends.append(s)
        port, stats = free_port(), free_port()
        conf = tmp_path / f"nutcracker-{kind}.yml"
        conf.write_text(
            "pool:\n"
            f"  listen: 127.0.0.1:{port}\n"
            "  hash: fnv1a_64\n"
            "  distribution: ketama\n"
            "  timeout: 3000\n"
            "  auto_eject_hosts: false\n"
            "  servers:\n" + "".join(f"   - 127.0.0.1:{b.port}:1\n" for b in backends))
        log = tmp_path / f"nutcracker-{kind}.log"
        p = subprocess.Popen([NUTCRACKER, "-c", str(conf), "-s", str(stats), "-a", "127.0.0.1",
                              "-o", str(log), "-p", str(tmp_path / f"nutcracker-{kind}.pid")],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=_die_with_parent)
        procs.append(p)
        wait_until(lambda: p.poll() is not None or _listening(port), timeout=10,
                   message="nutcracker listening")
        assert p.poll() is None, f"nutcracker exited: {log.read_text(errors='replace')}"
        return port

    yield make
    for p in procs:
        p.kill()
        p.wait(timeout=5)


def both(front, scenario):
    """The scenario's outcome behind memcached and behind shoal-nodes; they must be equal."""
    ref = scenario(front("memcached"))
    got = scenario(front("node"))
    assert got == ref, f"behind shoal-nodes {got!r}\nbehind memcached {ref!r}"
    return ref


def test_mixed_sizes_and_commands_through_twemproxy(front):
    def scenario(port):
        rng = random.Random(7)
        mc = Client(("127.0.0.1", port), timeout=5, connect_timeout=5)
        sizes = [1, 100, 1000, 5000, 100_000, 500_000]
        # random letters a-h, made in C (a byte at a time in Python took 15 s of the test)
        letters = bytes(b"abcdefgh"[i & 7] for i in range(256))
        values = {f"k{i}": rng.randbytes(rng.choice(sizes)).translate(letters) for i in range(120)}
        failed = mc.set_many(values, noreply=False)
        got = mc.get_many(list(values) + [f"miss{i}" for i in range(10)])
        out = {"failed": sorted(failed), "all_back": got == values}
        out["add_existing"] = mc.add("k1", b"x", noreply=False)
        out["incr"] = (mc.set("n", b"10", noreply=False), mc.incr("n", 5), mc.decr("n", 20))
        out["append"] = (mc.append("k2", b"++", noreply=False), mc.get("k2")[-2:])
        v, cas = mc.gets("k3")
        out["cas"] = (mc.cas("k3", b"new", cas, noreply=False), mc.cas("k3", b"old", cas, noreply=False),
                      mc.get("k3"))
        out["delete"] = (mc.delete("k4", noreply=False), mc.get("k4"), mc.delete("k4", noreply=False))
        mc.close()
        return out

    out = both(front, scenario)
    assert out["failed"] == [] and out["all_back"]


def test_control_byte_key_is_stored_through_twemproxy(front):
    """pylibmc and others pass a control byte in a key on; memcached stores it, and so must
    shoal, with the value (here command-looking data) kept as data."""
    def scenario(port):
        c = McRaw("127.0.0.1", port, timeout=5)
        assert c.store("set", "keep", "v") == "STORED"
        c.send("set ctl\x01key 0 0 9\r\nflush_all\r\n")
        stored = c.read_line()
        c.send("get ctl\x01key keep\r\n")
        lines = []
        while (line := c.read_line()) != "END":
            lines.append(line)
        c.close()
        return {"stored": stored, "got": lines}

    out = both(front, scenario)
    assert out["got"] == ["VALUE ctl\x01key 0 9", "flush_all", "VALUE keep 0 1", "v"]


def test_refused_store_data_never_runs_behind_twemproxy(front):
    """twemproxy closes a client whose store line it cannot parse, but passes on a value over
    the backend's item size: the backend refuses it, and its data block, which here starts with
    `flush_all`, must be swallowed, not run."""
    def scenario(port):
        c = McRaw("127.0.0.1", port, timeout=10)
        assert c.store("set", "keep", "v") == "STORED"
        block = b"flush_all\r\n" + b"x" * (2_000_000 - 11)
        c.send(b"set big 0 0 %d\r\n" % len(block) + block + b"\r\n")
        refused = c.read_line()
        c.send("get keep big\r\n")
        lines = []
        while (line := c.read_line()) != "END":
            lines.append(line)
        c.close()
        return {"refused": refused, "got": lines}

    out = both(front, scenario)
    assert out == {"refused": "SERVER_ERROR object too large for cache",
                   "got": ["VALUE keep 0 1", "v"]}


def test_long_multiget_through_twemproxy(front):
    """twemproxy splits a multi-get over its backends; a get of 3,000 keys (an 80 KiB line) must
    come back whole behind shoal-nodes as behind memcached."""
    def scenario(port):
        mc = Client(("127.0.0.1", port), timeout=10, connect_timeout=5)
        keys = [f"user:{i:06d}:profile-long-enough" for i in range(3000)]
        mc.set_many({k: k.encode() for k in keys[::2]}, noreply=False)
        got = mc.get_many(keys)
        mc.close()
        return {"hits": len(got), "right": all(got[k] == k.encode() for k in got)}

    out = both(front, scenario)
    assert out == {"hits": 1500, "right": True}
