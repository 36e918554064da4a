"""libmemcached's conformance checker, memccapable, in ASCII mode against the server."""

import shutil
import subprocess

import pytest


def find_tool():
    for name in ("memccapable", "memcapable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_memccapable_ascii_passes(server):
    tool = find_tool()
    if tool is None:
        pytest.fail("memccapable (or memcapable) not found: apt-get install libmemcached-tools")
    proc = subprocess.run([tool, "-h", "127.0.0.1", "-p", str(server.port), "-a", "-t", "5"],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    failed = [l for l in out.splitlines() if "[fail]" in l.lower()]
    assert proc.returncode == 0, f"memccapable exited {proc.returncode}:\n{out}"
    assert not failed, "memccapable reported failures:\n" + "\n".join(failed)
    assert "tests failed" not in out, out
    assert "[pass]" in out, f"memccapable ran no test:\n{out}"
