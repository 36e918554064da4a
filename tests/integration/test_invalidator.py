"""shoal-invalidator against a real PostgreSQL (issue 14, points 1, 2, 5, 6): row changes become
deletes of the keys their templates name, on the old and the new row; the invalidation table;
truncate; kill -9 mid-stream loses nothing; a 1,000,000-row UPDATE (streamed by PostgreSQL in
blocks before it commits) deletes every key; the admin port's figures.

One PostgreSQL per module (pgharness.py); each test has its own table, slot and publication, and
a shoal-node as its cluster. Keys are set with pipelined quiet `ms` and checked with pipelined
quiet `mg` (a miss answers nothing), so a check of thousands of keys is one round trip.
"""

import json
import os
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import _register, key_slot
from mcraw import McRaw, http, wait_until
from pgharness import Invalidator, PgServer, invalidator_binary


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    server = PgServer.start(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


@pytest.fixture
def start_invalidator(request, pg, tmp_path):
    """Factory: start_invalidator(node, tables, *flags, invalidation_table=None) -> Invalidator
    with a slot and publication named for the test; stopped, and its slot dropped, after.
    `node` may also be a dict of clusters: {"name": [server, ...]}."""
    started = []
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]

    def start(node, tables, *extra, invalidation_table=None, wait=True):
        clusters = node if isinstance(node, dict) else {"local": [node]}
        config = {"clusters": {cname: {"routers": [f"127.0.0.1:{s.port}" for s in servers]}
                               for cname, servers in clusters.items()},
                  "tables": tables}
        if invalidation_table:
            config["invalidation_table"] = invalidation_table
        inv = Invalidator.start(pg, config, tmp_path, "--slot", f"s_{name}", "--publication",
                                f"p_{name}", "--status-interval-ms", "100", *extra, wait=wait)
        inv.args = [str(invalidator_binary())]
        inv.slot = f"s_{name}"
        started.append(inv)
        _register(request.node, inv)
        return inv

    yield start
    problems = [inv.stop() for inv in started]
    if started:
        pg.sql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
               f"WHERE slot_name = 's_{name}' AND NOT active")
    for p in problems:
        assert p is None, f"shoal-invalidator {p}"


def set_keys(node, keys, value=b"v"):
    """Store every key in one pipelined write of quiet `ms` lines closed by `mn`."""
    with socket.create_connection(("127.0.0.1", node.port)) as s:
        chunk = []
        for k in keys:
            chunk.append(b"ms %s %d q\r\n%s\r\n" % (k.encode(), len(value), value))
        chunk.append(b"mn\r\n")
        s.sendall(b"".join(chunk))
        reply = b""
        while not reply.endswith(b"MN\r\n"):
            data = s.recv(65536)
            assert data, "the node closed the connection"
            reply += data
        assert reply == b"MN\r\n", f"a store was refused: {reply[:200]!r}"


def present(node, keys):
    """The keys among `keys` the node still holds (quiet mg: misses answer nothing)."""
    with socket.create_connection(("127.0.0.1", node.port)) as s:
        s.sendall(b"".join(b"mg %s k q\r\n" % k.encode() for k in keys) + b"mn\r\n")
        reply = b""
        while not reply.endswith(b"MN\r\n"):
            data = s.recv(65536)
            assert data, "the node closed the connection"
            reply += data
    return [line.split()[1].decode()[1:] for line in reply.split(b"\r\n")
            if line.startswith(b"HD")]


def cpu_seconds(pid):
    """User plus system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def products(pg, table, n):
    pg.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, sku text NOT NULL, price int NOT NULL);"
           f"INSERT INTO {table} SELECT i, 'sku' || i, 10 FROM generate_series(1, {n}) i")


@pytest.mark.wallclock
def test_update_deletes_the_rows_keys_within_a_second(pg, start_server, start_invalidator):
    products(pg, "p_update", 10)
    node = start_server()
    start_invalidator(node, {"public.p_update": {"keys": ["catalog:product:{id}",
                                                          "catalog:sku:{sku}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, 11)] + [f"catalog:sku:sku{i}"
                                                             for i in range(1, 11)]
    set_keys(node, keys)
    t0 = time.monotonic()
    pg.sql("UPDATE p_update SET price = price + 1 WHERE id = 3")
    wait_until(lambda: not present(node, ["catalog:product:3", "catalog:sku:sku3"]), timeout=1.0,
               interval=0.01, message="the updated row's keys to be deleted within 1 s")
    took = time.monotonic() - t0
    left = present(node, keys)
    assert len(left) == 18, f"only the updated row's two keys should go, left: {left}"
    assert took < 1.0


def test_update_reaches_every_cluster(pg, start_server, start_router, start_invalidator):
    products(pg, "p_clusters", 4)
    router, _, _ = start_router([start_server() for _ in range(3)])
    single = start_server()
    # a router in front of three nodes, and a lone node: two clusters
    start_invalidator({"routed": [router], "single": [single]},
                      {"public.p_clusters": {"keys": ["catalog:product:{id}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, 5)]
    set_keys(router, keys)
    set_keys(single, keys)
    pg.sql("UPDATE p_clusters SET price = 0 WHERE id IN (1, 2)")
    wait_until(lambda: present(router, keys) == keys[2:] and present(single, keys) == keys[2:],
               timeout=2, interval=0.01, message="rows 1 and 2's keys to go from both clusters")


def test_templated_column_change_deletes_old_and_new_key(pg, start_server, start_invalidator):
    products(pg, "p_sku", 3)
    assert pg.value("SELECT relreplident FROM pg_class WHERE relname = 'p_sku'") == "d"
    node = start_server()
    start_invalidator(node, {"public.p_sku": {"keys": ["catalog:sku:{sku}"]}})
    # sku is outside the primary key, so the table was made REPLICA IDENTITY FULL
    assert pg.value("SELECT relreplident FROM pg_class WHERE relname = 'p_sku'") == "f"
    set_keys(node, ["catalog:sku:sku1", "catalog:sku:renamed", "catalog:sku:sku2"])
    pg.sql("UPDATE p_sku SET sku = 'renamed' WHERE id = 1")
    wait_until(lambda: present(node, ["catalog:sku:sku1", "catalog:sku:renamed"]) == [],
               timeout=2, interval=0.01, message="the old and the new sku's keys to go")
    assert present(node, ["catalog:sku:sku2"]) == ["catalog:sku:sku2"]


def test_delete_deletes_the_old_rows_keys(pg, start_server, start_invalidator):
    products(pg, "p_del", 3)
    node = start_server()
    start_invalidator(node, {"public.p_del": {"keys": ["catalog:sku:{sku}"]}})
    set_keys(node, ["catalog:sku:sku2", "catalog:sku:sku3"])
    pg.sql("DELETE FROM p_del WHERE id = 2")
    wait_until(lambda: present(node, ["catalog:sku:sku2"]) == [], timeout=2, interval=0.01,
               message="the deleted row's key to go")
    assert present(node, ["catalog:sku:sku3"]) == ["catalog:sku:sku3"]


def test_identity_not_changed_when_refused(pg, start_server, start_invalidator):
    products(pg, "p_refuse", 1)
    node = start_server()
    inv = start_invalidator(node, {"public.p_refuse": {"keys": ["catalog:sku:{sku}"]}},
                            "--set-replica-identity=false", wait=False)
    assert inv.proc.wait(20) == 2
    inv.expect_exit = 2
    assert 'ALTER TABLE "public"."p_refuse" REPLICA IDENTITY FULL' in inv.stderr_text()
    assert pg.value("SELECT relreplident FROM pg_class WHERE relname = 'p_refuse'") == "d"


def test_invalidation_table_rows_become_deletes_and_are_cleaned(pg, start_server,
                                                                  start_invalidator):
    node = start_server()
    start_invalidator(node, {}, "--cleanup-interval-ms", "100",
                      invalidation_table="public.inv_keys")
    set_keys(node, ["user:42", "user:43", "feed:7"])
    # an application names the keys inside its own transaction
    pg.sql("BEGIN; INSERT INTO inv_keys (key) VALUES ('user:42'), ('feed:7'); COMMIT")
    wait_until(lambda: present(node, ["user:42", "feed:7"]) == [], timeout=2, interval=0.01,
               message="the named keys to go")
    assert present(node, ["user:43"]) == ["user:43"]
    wait_until(lambda: pg.value("SELECT count(*) FROM inv_keys") == "0", timeout=5,
               message="consumed rows to be deleted")


def test_rolled_back_invalidation_deletes_nothing(pg, start_server, start_invalidator):
    node = start_server()
    inv = start_invalidator(node, {}, invalidation_table="public.inv_rollback")
    set_keys(node, ["user:1", "user:2"])
    pg.sql("BEGIN; INSERT INTO inv_rollback (key) VALUES ('user:1'); ROLLBACK")
    pg.sql("INSERT INTO inv_rollback (key) VALUES ('user:2')")
    wait_until(lambda: present(node, ["user:2"]) == [], timeout=2, interval=0.01,
               message="the committed key to go")
    assert present(node, ["user:1"]) == ["user:1"]
    assert inv.metrics()["shoal_invalidator_invalidation_rows_total"] == 1


def ns_node(start_server, tmp_path, *names):
    """A shoal-node that has the namespaces `names`."""
    f = tmp_path / "namespaces.json"
    f.write_text(json.dumps({"namespaces": {n: {} for n in names}}))
    return start_server("--namespaces", str(f))


def test_truncate_flushes_only_the_namespace_the_table_maps_to(pg, start_server,
                                                               start_invalidator, tmp_path):
    products(pg, "p_trunc", 5)
    node = ns_node(start_server, tmp_path, "catalog", "users")
    inv = start_invalidator(node, {"public.p_trunc": {"keys": ["catalog:product:{id}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, 6)]
    others = ["users:1", "users:2", "plain"]
    set_keys(node, keys + others)
    pg.sql("TRUNCATE p_trunc")
    wait_until(lambda: present(node, keys) == [],
               timeout=2, interval=0.01, message="the truncated table's keys to go")
    assert sorted(present(node, others)) == sorted(others), "a flush_all, not a namespace flush"
    # counted once delivery returns, a moment after the flush itself
    wait_until(lambda: inv.metrics()["shoal_invalidator_truncates_total"] == 1, timeout=2,
               message="the truncate to be counted")
    m = inv.metrics()
    assert m['shoal_invalidator_cluster_flushes_total{cluster="local"}'] == 1
    assert m['shoal_invalidator_cluster_flush_all_fallbacks_total{cluster="local"}'] == 0


def test_truncate_of_a_namespace_the_cluster_lacks_falls_back_to_flush_all(
        pg, start_server, start_invalidator):
    products(pg, "p_trunc_all", 3)
    node = start_server()  # no namespace "catalog": its keys are in default there
    inv = start_invalidator(node, {"public.p_trunc_all": {"keys": ["catalog:product:{id}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, 4)] + ["users:1"]
    set_keys(node, keys)
    pg.sql("TRUNCATE p_trunc_all")
    wait_until(lambda: present(node, keys) == [], timeout=2, interval=0.01,
               message="flush_all to empty the node")
    wait_until(lambda: inv.metrics().get(
        'shoal_invalidator_cluster_flush_all_fallbacks_total{cluster="local"}') == 1,
        timeout=2, message="the fallback to be counted")


def test_control_plane_templates_delete_keys_and_follow_changes(pg, start_server, start_control,
                                                               start_invalidator):
    """--control: a namespace's invalidation tables map a table the config does not list; a
    change of its templates applies to the next update (the new column's table made REPLICA
    IDENTITY FULL and still in the publication)."""
    products(pg, "p_ctl", 3)
    node = start_server()
    ctl = start_control()
    assert ctl.post("/v1/pools", {"name": "main", "nodes": [f"127.0.0.1:{node.port}"]})[0] == 201
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "invalidation": {
        "tables": {"public.p_ctl": ["catalog:product:{id}"]}}})
    assert status == 201, body
    inv = start_invalidator(node, {}, "--control", f"http://127.0.0.1:{ctl.port}")
    set_keys(node, ["catalog:product:1", "catalog:product:2", "catalog:sku:sku2"])
    pg.sql("UPDATE p_ctl SET price = 1 WHERE id = 1")
    wait_until(lambda: present(node, ["catalog:product:1"]) == [], timeout=2, interval=0.01,
               message="the control plane's template to delete the updated row's key")
    assert pg.value("SELECT relreplident FROM pg_class WHERE relname = 'p_ctl'") == "d"

    status, body = ctl.put("/v1/namespaces/catalog", {"invalidation": {
        "tables": {"public.p_ctl": ["catalog:sku:{sku}"]}}})
    assert status == 200, body
    wait_until(lambda: inv.metrics()["shoal_invalidator_templates_version"] >= body["version"],
               timeout=5, message="the invalidator to use the new templates")
    pg.sql("UPDATE p_ctl SET price = 2 WHERE id = 2")
    wait_until(lambda: present(node, ["catalog:sku:sku2"]) == [], timeout=2, interval=0.01,
               message="the new template's key to go on the next update")
    assert present(node, ["catalog:product:2"]) == ["catalog:product:2"], \
        "the replaced template still in use"
    assert pg.value("SELECT relreplident FROM pg_class WHERE relname = 'p_ctl'") == "f"


def test_control_without_config_tables_waits_for_the_first_topology(pg, start_server,
                                                                    start_control,
                                                                    start_invalidator):
    products(pg, "p_ctl_wait", 2)
    node = start_server()
    ctl = start_control()  # version 0: no topology yet
    inv = start_invalidator(node, {}, "--control", f"http://127.0.0.1:{ctl.port}", wait=False)
    wait_until(lambda: "waiting for the control plane's first topology" in inv.stderr_text(),
               timeout=10, message="the invalidator to wait for the control plane")
    assert not inv.healthy(), "streaming before the control plane's templates are known"
    ctl.post("/v1/pools", {"name": "main", "nodes": [f"127.0.0.1:{node.port}"]})
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "invalidation": {
        "tables": {"public.p_ctl_wait": ["catalog:product:{id}"]}}})
    assert status == 201, body
    inv.wait_healthy()
    # the pool's version alone (no templates yet) may be the first one taken
    wait_until(lambda: inv.metrics()["shoal_invalidator_templates_version"] >= body["version"],
               timeout=5, message="the invalidator to use the namespace's templates")
    set_keys(node, ["catalog:product:2"])
    pg.sql("UPDATE p_ctl_wait SET price = 3 WHERE id = 2")
    wait_until(lambda: present(node, ["catalog:product:2"]) == [], timeout=2, interval=0.01,
               message="the key to go once the templates came")


def test_control_table_created_later_is_mapped_on_retry(pg, start_server, start_control,
                                                       start_invalidator):
    """A namespace's table that does not exist yet is left out (counted), and mapped by the
    retry once a migration creates it."""
    node = start_server()
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [f"127.0.0.1:{node.port}"]})
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "invalidation": {
        "tables": {"public.p_later": ["catalog:product:{id}"]}}})
    inv = start_invalidator(node, {}, "--control", f"http://127.0.0.1:{ctl.port}")
    wait_until(lambda: inv.metrics()["shoal_invalidator_templates_refused"] == 1, timeout=5,
               message="the missing table to be counted")
    assert "table public.p_later: no such table" in inv.stderr_text()
    products(pg, "p_later", 2)
    wait_until(lambda: inv.metrics()["shoal_invalidator_mapped_tables"] == 1, timeout=10,
               interval=0.1, message="the retry to map the new table")
    assert inv.metrics()["shoal_invalidator_templates_refused"] == 0
    set_keys(node, ["catalog:product:1"])
    pg.sql("UPDATE p_later SET price = 5 WHERE id = 1")
    wait_until(lambda: present(node, ["catalog:product:1"]) == [], timeout=2, interval=0.01,
               message="the table's key to go")


def test_kill9_mid_stream_then_restart_loses_no_delete(pg, start_server, start_invalidator):
    n = 3000
    products(pg, "p_kill", n)
    node = start_server()
    inv = start_invalidator(node, {"public.p_kill": {"keys": ["catalog:product:{id}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, n + 1)]
    set_keys(node, keys)
    # one transaction per row, from one psql session
    script = "".join(f"UPDATE p_kill SET price = price + 1 WHERE id = {i};\n"
                     for i in range(1, n + 1))
    writer = subprocess.Popen(["/usr/bin/psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U",
                               "postgres", "-d", "postgres", "-X", "-q", "-v", "ON_ERROR_STOP=1"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    threading.Thread(target=lambda: (writer.stdin.write(script), writer.stdin.close()),
                     daemon=True).start()
    wait_until(lambda: inv.metrics()["shoal_invalidator_keys_total"] >= 200, timeout=10,
               interval=0.01, message="deletes to flow")
    inv.kill9()
    gone_at_kill = n - len(present(node, keys))
    assert writer.wait(60) == 0
    inv2 = inv.restart()
    wait_until(lambda: present(node, keys) == [], timeout=15, interval=0.1,
               message="every updated row's key to be deleted after the restart")
    assert gone_at_kill < n, "the kill came after every delete: nothing was in flight"
    wait_until(lambda: inv2.metrics()["shoal_invalidator_keys_total"] > 0, timeout=2,
               message="the restarted invalidator to have sent deletes (it had work left)")
    assert inv2.stop() is None


def test_rolled_back_streamed_transaction_deletes_nothing(pg, start_server, start_invalidator):
    n = 2000  # past logical_decoding_work_mem (64kB): PostgreSQL streams it before the end
    products(pg, "p_abort", n)
    node = start_server()
    inv = start_invalidator(node, {"public.p_abort": {"keys": ["catalog:product:{id}"]}})
    keys = [f"catalog:product:{i}" for i in range(1, n + 1)]
    set_keys(node, keys)
    pg.sql("BEGIN; UPDATE p_abort SET price = price + 1; ROLLBACK")
    pg.sql("UPDATE p_abort SET price = 0 WHERE id = 1")  # a marker after it
    wait_until(lambda: "catalog:product:1" not in present(node, keys[:1]), timeout=5,
               interval=0.01, message="the marker row's key to go")
    assert len(present(node, keys)) == n - 1, "the rolled back update deleted keys"
    assert inv.metrics()["shoal_invalidator_aborted_streams_total"] >= 1


def test_quiet_mapped_tables_do_not_hold_wal_back(pg, start_server, start_invalidator):
    products(pg, "p_quiet", 1)
    pg.sql("CREATE TABLE unmapped_busy (x int)")
    node = start_server()
    inv = start_invalidator(node, {"public.p_quiet": {"keys": ["catalog:product:{id}"]}})
    # WAL from a table outside the publication: pgoutput sends no transaction for it
    pg.sql("INSERT INTO unmapped_busy SELECT generate_series(1, 1000)")
    target = pg.value("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    wait_until(lambda: pg.value(f"SELECT confirmed_flush_lsn - '0/0'::pg_lsn >= {target} FROM "
                                f"pg_replication_slots WHERE slot_name = '{inv.slot}'") == "t",
               timeout=10, interval=0.1, message="the slot to confirm past the unmapped writes")


def test_postgres_restart_resumes_the_stream(pg, start_server, start_invalidator):
    products(pg, "p_restart", 2)
    node = start_server()
    inv = start_invalidator(node, {"public.p_restart": {"keys": ["catalog:product:{id}"]}},
                            "--reconnect-max-ms", "200")
    pg.halt()
    try:
        wait_until(lambda: http(inv.admin, "GET", "/healthz")[0] == 503, timeout=5,
                   message="/healthz to say the stream is down")
    finally:
        pg.resume()
    inv.wait_healthy()
    set_keys(node, ["catalog:product:1", "catalog:product:2"])
    pg.sql("UPDATE p_restart SET price = 0 WHERE id = 2")
    wait_until(lambda: present(node, ["catalog:product:2"]) == [], timeout=2, interval=0.01,
               message="the update after the restart to delete its key")
    assert present(node, ["catalog:product:1"]) == ["catalog:product:1"]
    assert inv.metrics()["shoal_invalidator_reconnects_total"] >= 1


def test_million_row_update_in_one_transaction_deletes_every_key(pg, start_server,
                                                                 start_invalidator):
    n = 1_000_000
    # fillfactor 50: room in each page, so the UPDATE's new row versions stay on their page and
    # skip the index (HOT), which roughly halves its time; the key is added after the rows, one
    # index build instead of a million inserts into it
    t0 = time.monotonic()
    pg.sql(f"CREATE TABLE p_big (id int NOT NULL, v int NOT NULL) WITH (fillfactor = 50);"
           f"INSERT INTO p_big SELECT i, 0 FROM generate_series(1, {n}) i;"
           f"ALTER TABLE p_big ADD PRIMARY KEY (id)")
    load_s = time.monotonic() - t0
    node = start_server("-m", "512")
    inv = start_invalidator(node, {"public.p_big": {"keys": ["big:{id}"]}},
                            "--batch-max", "4096")
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", node.port)) as s:
        for lo in range(1, n + 1, 100_000):
            s.sendall(b"".join(b"ms big:%d 1 q\r\nv\r\n" % i for i in range(lo, lo + 100_000)))
        s.sendall(b"mn\r\n")
        reply = b""
        while not reply.endswith(b"MN\r\n"):
            reply += s.recv(65536)
        assert reply == b"MN\r\n", reply[:200]
    set_s = time.monotonic() - t0
    with McRaw("127.0.0.1", node.port) as c:
        assert int(c.stats()["curr_items"]) == n
    cpu0 = cpu_seconds(inv.proc.pid)
    t1 = time.monotonic()
    pg.sql("UPDATE p_big SET v = v + 1")
    update_s = time.monotonic() - t1

    def items():
        with McRaw("127.0.0.1", node.port) as c:
            return int(c.stats()["curr_items"])
    wait_until(lambda: items() == 0, timeout=120, interval=0.2,
               message="every one of the million keys to be deleted")
    total_s = time.monotonic() - t1
    cpu_us = (cpu_seconds(inv.proc.pid) - cpu0) * 1e6 / n
    m = inv.metrics()
    assert m["shoal_invalidator_streamed_transactions_total"] >= 1
    assert m["shoal_invalidator_keys_total"] >= n
    print(f"\n1M rows loaded in {load_s:.1f}s; 1M keys set in {set_s:.1f}s; UPDATE "
          f"{update_s:.1f}s; all deleted {total_s:.1f}s after the UPDATE began; invalidator CPU "
          f"{cpu_us:.2f} us per row (stand-in delivery included)")


def test_metrics_report_the_confirmed_lsn_postgresql_holds(pg, start_server, start_invalidator):
    products(pg, "p_metrics", 2)
    node = start_server()
    inv = start_invalidator(node, {"public.p_metrics": {"keys": ["catalog:product:{id}"]}})
    pg.sql("UPDATE p_metrics SET price = 1")
    # the insert position, past the commit record: with synchronous_commit off (the harness)
    # the write position pg_current_wal_lsn() may still be before it, and a keepalive's
    # position could then pass it before the commit is even sent
    after = int(pg.value("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))

    def confirmed():
        lsn = pg.value(f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                       f"slot_name = '{inv.slot}'")
        hi, lo = lsn.split("/")
        held = (int(hi, 16) << 32) | int(lo, 16)
        m = inv.metrics()
        return m["shoal_invalidator_confirmed_lsn"] == held and held >= after and m
    m = wait_until(confirmed, timeout=5, message="the slot to hold the LSN /metrics reports")
    for name in ("lag_bytes", "lag_seconds", "server_lsn", "transactions_total", "streaming"):
        assert f"shoal_invalidator_{name}" in m, name
    assert m["shoal_invalidator_streaming"] == 1
    assert m["shoal_invalidator_transactions_total"] >= 1
    status, body = http(inv.admin, "GET", "/healthz")
    assert status == 200 and '"streaming": true' in body


def test_replay_sends_a_slots_recent_deletes_again(pg, start_server, start_invalidator):
    """POST /v1/replay on the admin port: the deletes of the last seconds whose keys fall in the
    given slots go out again (what a replica promotion needs), and no other key is touched."""
    products(pg, "p_replay_ok", 2)
    node = start_server()
    inv = start_invalidator(node, {"public.p_replay_ok": {"keys": ["catalog:product:{id}"]}})
    keys = ["catalog:product:1", "catalog:product:2"]
    set_keys(node, keys)
    pg.sql("UPDATE p_replay_ok SET price = price + 1")
    wait_until(lambda: not present(node, keys), timeout=10, message="both keys deleted")
    set_keys(node, keys)  # as a promoted replica that missed the deletes would hold them
    slot = key_slot(keys[0])
    assert key_slot(keys[1]) != slot, "the test needs the two keys in different slots"
    status, body = http(inv.admin, "POST", "/v1/replay", {"slots": [slot], "since_s": 60})
    assert status == 200 and json.loads(body)["queued"] >= 1, body
    wait_until(lambda: present(node, keys) == [keys[1]], timeout=10,
               message="the replayed slot's key deleted again, the other left")


def test_replay_refuses_a_bad_body(pg, start_server, start_invalidator):
    products(pg, "p_replay", 1)
    node = start_server()
    inv = start_invalidator(node, {"public.p_replay": {"keys": ["catalog:product:{id}"]}})
    status, body = http(inv.admin, "POST", "/v1/replay", {"slots": [99999]})
    assert status == 400 and "out of range" in body
    status, body = http(inv.admin, "POST", "/v1/replay", {"slots": "all"})
    assert status == 400


def test_bad_config_names_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"clusters": {"local": {"routers": ["127.0.0.1:1"]}}, '
                    '"tables": {"public.t": {"keys": ["catalog:{id"]}}}')
    r = subprocess.run([str(invalidator_binary()), "--pg", "host=127.0.0.1 port=1", "--config",
                        str(path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert "tables.public.t.keys[0]" in r.stderr and "not closed" in r.stderr


def test_replica_served_cluster_never_keeps_an_old_row(start_server, tmp_path, request):
    """Point 6's race: readers fill the cache from a PostgreSQL replica that lags on purpose
    (recovery_min_apply_delay) while updates commit on the primary. Cache-aside as shoal's
    readers do it: `mg v c N30` on a miss wins a lease (W), the winner SELECTs the row on the
    replica and fills with `ms ... C<cas>` (a delete in between voids the fill). Since the
    cluster is marked as served by that replica, its deletes wait until the replica has replayed
    the commit: a reader that misses after a delete reads the new row. So once the replica has
    caught up, every cached value is the primary's latest within delivery's and a reader pass's
    time, and stays so. (Without the gate a reader refills the old row from the lagging replica
    right after the delete, and it stays cached.)"""
    from pgreplica import PgReplicaPair
    nrows, nupdates = 5, 150
    with PgReplicaPair(replica_opts="-c recovery_min_apply_delay=200ms") as pair:
        pair.primary("CREATE TABLE race (id int PRIMARY KEY, v int NOT NULL)")
        pair.primary(f"INSERT INTO race SELECT g, 0 FROM generate_series(1, {nrows}) g")
        wait_until(lambda: pair.replica("SELECT count(*) FROM pg_class WHERE relname = 'race'")
                   == "1" and pair.replica("SELECT count(*) FROM race") == str(nrows),
                   timeout=10, message="the rows on the replica")
        node = start_server()
        config = {"clusters": {"region": {"routers": [f"127.0.0.1:{node.port}"],
                                          "replica": pair.conninfo(pair.rport)}},
                  "tables": {"public.race": {"keys": ["race:{id}"]}}}
        inv = Invalidator.start(pair.p, config, tmp_path, "--slot", "s_race", "--publication",
                                "p_race", "--status-interval-ms", "100")
        inv.args = [str(invalidator_binary())]
        _register(request.node, inv)
        stop = threading.Event()
        passes = [0, 0]
        errors = []

        def reader(idx):
            try:
                db = pair.r.session()
                with McRaw("127.0.0.1", node.port) as mc:
                    while not stop.is_set():
                        for i in range(1, nrows + 1):
                            got = mc.meta(f"mg race:{i} v c N30")
                            if "W" not in got:
                                continue  # a hit, or someone else is filling
                            rows = db.query(f"SELECT v FROM race WHERE id = {i}")
                            value = rows[0][0].encode()
                            # HD, or NF/EX when a delete voided the lease meanwhile
                            mc.meta(f"ms race:{i} {len(value)} C{got.cas}", value)
                        passes[idx] += 1
                db.close()
            except Exception as e:  # reported by the test, not lost in the thread
                errors.append(repr(e))

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            db = pair.p.session()
            for n in range(1, nupdates + 1):
                db.query(f"UPDATE race SET v = {n} WHERE id = {n % nrows + 1}")
                time.sleep(0.005)
            db.close()
            latest = {int(i): v for i, v in (r.split("|") for r in
                      pair.primary("SELECT id, v FROM race ORDER BY id").splitlines())}

            def cached():
                with McRaw("127.0.0.1", node.port) as mc:
                    out = {}
                    for i in range(1, nrows + 1):
                        got = mc.meta(f"mg race:{i} v")
                        out[i] = got.value.decode() if got.code == "VA" else None
                    return out

            wait_until(lambda: pair.replica("SELECT string_agg(v::text, ',' ORDER BY id) "
                                            "FROM race") ==
                       ",".join(latest[i] for i in range(1, nrows + 1)),
                       timeout=15, message="the replica to catch up")
            # delivery (replica poll, batch) plus a reader pass, with scheduling slack
            wait_until(lambda: cached() == latest, timeout=5, interval=0.02,
                       message=f"the cache to hold the latest rows {latest} (has {cached()}, "
                               f"readers' errors {errors})")
            seen = list(passes)
            wait_until(lambda: all(p >= s + 3 for p, s in zip(passes, seen)), timeout=10,
                       message="three more reader passes")
            assert cached() == latest, "an old row was cached again after the latest"
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        assert not errors, errors
        assert inv.metrics()['shoal_invalidator_cluster_replica_up{cluster="region"}'] == 1
        assert inv.stop() is None
        pair.primary("SELECT pg_drop_replication_slot('s_race')")


def test_promotion_in_the_followed_document_replays_the_promoted_slots(pg, start_server,
                                                                       start_invalidator):
    """--control: a newer document whose slot's replica became its node (a promotion,
    FAILOVER.md C1) makes the invalidator send that slot's recent deletes again, to every
    cluster, as POST /v1/replay would; other slots are left alone."""
    from fakecontrol import FakeControl
    products(pg, "p_promo", 2)
    node = start_server()
    keys = ["catalog:product:1", "catalog:product:2"]
    s = key_slot(keys[0])
    assert key_slot(keys[1]) != s and 0 < s < 16383

    def doc(version, owner):
        a, b = "127.0.0.1:1", "127.0.0.1:2"
        slots = [{"from": 0, "to": s - 1, "node": a},
                 {"from": s, "to": s, "node": owner, **({"replica": b} if owner == a else {})},
                 {"from": s + 1, "to": 16383, "node": a}]
        return {"version": version, "pools": {"main": {"nodes": [a, b], "slots": slots}},
                "namespaces": {"default": {"pool": "main", "copies": 2}}}

    control = FakeControl()
    try:
        control.publish(doc(1, "127.0.0.1:1"))
        inv = start_invalidator(node, {"public.p_promo": {"keys": ["catalog:product:{id}"]}},
                                "--control", control.url)
        set_keys(node, keys)
        pg.sql("UPDATE p_promo SET price = price + 1")
        wait_until(lambda: not present(node, keys), timeout=10, message="both keys deleted")
        set_keys(node, keys)  # as a promoted replica that missed the deletes would hold them
        control.publish(doc(2, "127.0.0.1:2"))
        wait_until(lambda: present(node, keys) == [keys[1]], timeout=10,
                   message="the promoted slot's key deleted again, the other left")
        assert "promoted 1 slots" in inv.stderr_text()
    finally:
        control.stop()
