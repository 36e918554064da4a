"""shoal-control's embedded state (issue 13.4): every acknowledged change is in the state file
before the answer, so kill -9 and a restart lose none and the version never goes back; a state
that cannot be stored refuses the change; a broken state file stops the start."""

import json
import os
import threading

import pytest

from mcraw import wait_until


def everything(ctl):
    return ctl.topology(), ctl.get("/v1/namespaces")[1], ctl.get("/v1/pools")[1]


def test_kill9_and_restart_keep_every_acknowledged_change(start_control):
    ctl = start_control()
    assert ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001",
                                                            "127.0.0.1:21002"]})[0] == 201
    assert ctl.post("/v1/pools", {"name": "gutter", "nodes": ["127.0.0.1:21009"],
                                  "gutter": True, "gutter_ttl": 9})[0] == 201
    assert ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 4 << 20,
                                       "team": "shop", "copies": 2})[0] == 201
    assert ctl.put("/v1/namespaces/catalog", {"max_ttl": 600})[0] == 200
    assert ctl.post("/v1/pools/main/nodes", {"node": "127.0.0.1:21003",
                                             "admin": "127.0.0.1:21103"})[0] == 200
    assert ctl.post("/v1/namespaces", {"name": "gone", "pool": "main"})[0] == 201
    assert ctl.delete("/v1/namespaces/gone")[0] == 200
    before = everything(ctl)
    assert before[0]["version"] == 7
    ctl.kill9()
    again = start_control(data_dir=ctl.data_dir)
    assert everything(again) == before
    assert again.post("/v1/namespaces", {"name": "next", "pool": "main"})[1]["version"] == 8


def test_kill9_under_a_stream_of_changes_loses_no_acknowledged_one(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    acked = []  # (name, version) of every namespace whose creation was answered 201

    def writer():
        for i in range(100000):
            try:
                status, body = ctl.post("/v1/namespaces", {"name": f"ns{i}", "pool": "main"})
            except OSError:
                return  # the process is gone
            if status != 201:
                return
            acked.append((f"ns{i}", body["version"]))
            if len(acked) >= 200:
                return

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    wait_until(lambda: len(acked) >= 40, timeout=20, message="40 acknowledged changes")
    ctl.kill9()
    t.join(10)
    again = start_control(data_dir=ctl.data_dir)
    doc = again.topology()
    assert doc["version"] >= acked[-1][1]
    missing = [n for n, _ in acked if n not in doc["namespaces"]]
    assert missing == []


def test_state_file_is_replaced_whole(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    path = ctl.data_dir / "state.json"
    stored = json.loads(path.read_text())
    assert stored["version"] == 1 and stored["format"] == 1
    assert not (ctl.data_dir / "state.json.tmp").exists()


def test_change_that_cannot_be_stored_is_refused_and_changes_nothing(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    before = everything(ctl)
    os.mkdir(ctl.data_dir / "state.json.tmp")  # the temporary file cannot be created
    status, err = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    assert status == 503 and (err["field"], err["rule"]) == ("state", "stored")
    assert everything(ctl) == before
    assert ctl.metrics()["shoal_control_state_write_failures_total"] == 1
    os.rmdir(ctl.data_dir / "state.json.tmp")
    assert ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})[1]["version"] == 2


@pytest.mark.parametrize("content", ["{not json", '{"format": 99}',
                                     '{"format": 1, "version": 3, "pools": {}, "namespaces": '
                                     '{"x": {"pool": "none"}}, "gutter_ttl": 10}'])
def test_broken_state_file_stops_the_start_with_a_message(tmp_path, content):
    import subprocess
    from controlharness import CONTROL_BIN
    d = tmp_path / "d"
    d.mkdir()
    (d / "state.json").write_text(content)
    r = subprocess.run([str(CONTROL_BIN), "-p", "0", "--data-dir", str(d)], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 2
    assert "state" in r.stderr and str(d / "state.json") in r.stderr
    assert (d / "state.json").read_text() == content  # left as it was


def test_state_option_names_the_file(start_control, tmp_path):
    path = tmp_path / "elsewhere.json"
    ctl = start_control("--state", str(path))
    ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    assert json.loads(path.read_text())["version"] == 1
