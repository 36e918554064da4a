"""shoal-control --etcd (issue 13.4, high availability): several shoal-control processes share
their state in a real 3-member etcd cluster (etcdharness.py); one is leader through an etcd
lease, the others forward changes to it and follow the stored state. A change through a
follower is applied and seen everywhere; when the leader is killed another takes over within
5 s with every acknowledged change kept and versions never going back; a dead etcd member
changes nothing; a deposed leader cannot write."""

import http.client
import json
import signal
import threading
import time
import uuid

import pytest

from etcdharness import etcd_cluster  # noqa: F401  (a fixture)
from mcraw import wait_until

TAKEOVER_LIMIT = 5.0  # issue 13.4: another takes over within 5 s


@pytest.fixture
def group(etcd_cluster, start_control):
    """start(n, *flags) -> n shoal-control processes sharing one fresh prefix of the cluster."""
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"

    def start(n, *flags):
        return [start_control("--etcd", etcd_cluster.urls, "--etcd-prefix", prefix, *flags)
                for _ in range(n)]

    start.prefix = prefix
    return start


def queued_request(port):
    """Is a request waiting unread on an established connection to 127.0.0.1:port (the kernel's
    view, /proc/net/tcp: the process may be stopped)?"""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if int(local.split(":")[1], 16) == port and state == "01" and \
                    int(queues.split(":")[1], 16) > 0:
                return True
    return False


def is_leader(ctl):
    try:
        return ctl.metrics()["shoal_control_leader"] == 1
    except OSError:
        return False


def one_leader(ctls):
    """Wait until exactly one of `ctls` is leader; return it."""
    found = wait_until(lambda: (lambda ls: ls[0] if len(ls) == 1 else None)(
        [c for c in ctls if is_leader(c)]), timeout=10, interval=0.05, message="one leader")
    return found


def followers(ctls, leader):
    return [c for c in ctls if c is not leader]


def ns_names(ctl):
    return set(ctl.topology()["namespaces"])


def stored_buckets(etcd_cluster, prefix):
    """{key: (mod_revision, namespaces)} of the namespace buckets stored under prefix ns/."""
    import base64
    from etcdharness import b64
    rep = etcd_cluster.call("/v3/kv/range", {"key": b64(prefix + "ns/"),
                                             "range_end": b64(prefix + "ns0")})
    return {base64.b64decode(kv["key"]).decode(): (int(kv["mod_revision"]),
                                                   json.loads(base64.b64decode(kv["value"])))
            for kv in rep.get("kvs", [])}


def stored_namespaces(etcd_cluster, prefix):
    out = {}
    for _, nss in stored_buckets(etcd_cluster, prefix).values():
        out.update(nss)
    return out


def test_change_through_follower_is_applied_and_seen_by_all(group):
    ctls = group(3)
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    status, body = f.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
    assert status == 201, body
    assert body["version"] == 1
    # the follower that forwarded it shows it at once; the others within a poll or two
    assert f.version() == 1 and f.get("/v1/pools/main")[0] == 200
    for c in ctls:
        wait_until(lambda: c.version() == 1, timeout=3, message="version 1 everywhere")
    status, body = f.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    assert status == 201 and body["version"] == 2
    for c in ctls:
        wait_until(lambda: "catalog" in ns_names(c), timeout=3, message="catalog everywhere")
    assert len({json.dumps(c.topology(), sort_keys=True) for c in ctls}) == 1
    assert f.metrics()["shoal_control_writes_forwarded_total"] == 2
    assert leader.metrics()["shoal_control_changes_applied_total"] == 2


def test_invalid_change_through_follower_gets_the_leaders_refusal(group):
    ctls = group(2)
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    status, body = f.post("/v1/namespaces", {"name": "x", "pool": "nope"})
    assert status == 400 and body["field"] == "pool"
    assert f.version() == 0 and leader.version() == 0


def test_leader_kill9_under_changes_loses_no_acknowledged_one(group):
    ctls = group(3)
    leader = one_leader(ctls)
    assert leader.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    survivors = followers(ctls, leader)
    acked = []  # (name, version) of every creation answered 201, in order
    stop, stop_polls = threading.Event(), threading.Event()
    seen = {id(c): [] for c in survivors}  # versions each survivor's long polls returned
    errors = []

    def writer():
        i = 0
        while not stop.is_set():
            target = survivors[i % 2]
            try:
                status, body = target.post("/v1/namespaces", {"name": f"ns{i}", "pool": "main"})
            except OSError:
                status, body = 0, None
            if status == 201:
                acked.append((f"ns{i}", body["version"]))
            i += 1

    def poller(c):
        after = 0
        while not stop_polls.is_set():
            try:
                status, doc = c.get(f"/v1/topology?after={after}", timeout=30)
            except OSError as e:
                errors.append(f"long poll on a survivor failed: {e}")
                return
            if status == 200:
                seen[id(c)].append(doc["version"])
                after = doc["version"]

    threads = [threading.Thread(target=writer, daemon=True)] + [
        threading.Thread(target=poller, args=(c,), daemon=True) for c in survivors]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 20, timeout=20, message="20 acknowledged changes")
    leader.kill9()
    killed_at, before = time.monotonic(), len(acked)
    new = wait_until(lambda: next((c for c in survivors if is_leader(c)), None), timeout=10,
                     interval=0.05, message="a new leader")
    took = time.monotonic() - killed_at
    wait_until(lambda: len(acked) >= before + 20, timeout=20,
               message="20 more acknowledged changes after the takeover")
    stop.set()
    threads[0].join(20)
    assert took <= TAKEOVER_LIMIT, f"takeover took {took:.2f}s"
    last = acked[-1][1]
    for c in survivors:
        wait_until(lambda: c.version() >= last, timeout=3, message="the last acknowledged version")
        missing = [n for n, _ in acked if n not in ns_names(c)]
        assert missing == [], f"acknowledged but lost: {missing}"
    versions = [v for _, v in acked]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # a long poll after the last change still works on every survivor, the new leader included
    assert new.post("/v1/namespaces", {"name": "final", "pool": "main"})[0] == 201
    for c in survivors:
        wait_until(lambda: seen[id(c)] and seen[id(c)][-1] >= last + 1, timeout=5,
                   message=f"the survivors' long polls to return the last version {last + 1} "
                           f"(seen {seen[id(c)][-5:]})")
    stop_polls.set()
    new.post("/v1/namespaces", {"name": "wake", "pool": "main"})  # ends the polls held now
    for t in threads[1:]:
        t.join(35)
    assert errors == []
    for c in survivors:
        assert seen[id(c)] == sorted(seen[id(c)]), "a long poll returned an older version"


ADMIN = "admin-token-0123456789abcdef"
SHOP = "shop-token-0123456789abcdef"
OTHER = "other-token-0123456789abcdef"


def call(ctl, method, path, body=None, token=None):
    """(status, parsed JSON body) of one request to `ctl`, with a bearer token when given."""
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=15)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body) if body is not None else None
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read().decode()
    finally:
        conn.close()
    return r.status, json.loads(text) if text else None


@pytest.fixture
def auth_group(group, tmp_path):
    """(leader, follower, every process) of two processes with the same --auth-file, pool
    `main` and namespaces `shopns` (team shop) and `otherns` (team other), made by an admin
    through the follower."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"tokens": [
        {"token": ADMIN, "role": "admin", "name": "ops"},
        {"token": SHOP, "team": "shop"},
        {"token": OTHER, "team": "other"},
    ]}))
    path.chmod(0o600)
    ctls = group(2, "--auth-file", str(path))
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    for p, body in (("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]}),
                    ("/v1/namespaces", {"name": "shopns", "pool": "main", "team": "shop"}),
                    ("/v1/namespaces", {"name": "otherns", "pool": "main", "team": "other"})):
        status, reply = call(f, "POST", p, body, ADMIN)
        assert status == 201, reply
    for c in ctls:
        wait_until(lambda: c.version() == 3, timeout=3, message="version 3 everywhere")
    return leader, f, ctls


def group_state(ctls):
    return [json.dumps(c.topology(), sort_keys=True) for c in ctls]


def test_admin_token_write_through_follower_reaches_the_leader(auth_group):
    leader, f, ctls = auth_group
    status, reply = call(f, "PUT", "/v1/namespaces/otherns", {"memory": 4 << 20}, ADMIN)
    assert status == 200, reply
    assert reply["namespace"]["memory"] == 4 << 20
    wait_until(lambda: leader.get("/v1/namespaces/otherns")[1]["namespace"]["memory"] == 4 << 20,
               timeout=3, message="the change on the leader")
    assert f.metrics()["shoal_control_writes_forwarded_total"] == 4


def test_team_token_changes_its_own_namespace_through_follower(auth_group):
    leader, f, ctls = auth_group
    status, reply = call(f, "POST", "/v1/namespaces",
                         {"name": "cart", "pool": "main", "team": "shop"}, SHOP)
    assert status == 201, reply
    status, reply = call(f, "PUT", "/v1/namespaces/shopns", {"memory": 2 << 20}, SHOP)
    assert status == 200 and reply["namespace"]["memory"] == 2 << 20, reply
    status, reply = call(f, "DELETE", "/v1/namespaces/cart", None, SHOP)
    assert status == 200, reply
    for c in ctls:
        wait_until(lambda: c.version() == 6, timeout=3, message="version 6 everywhere")
        assert "cart" not in ns_names(c)


def test_team_token_on_another_teams_namespace_through_follower_is_403(auth_group):
    leader, f, ctls = auth_group
    before = group_state(ctls)
    status, reply = call(f, "PUT", "/v1/namespaces/otherns", {"memory": 2 << 20}, SHOP)
    assert status == 403 and "shop" in reply["error"] and "other" in reply["error"], reply
    status, reply = call(f, "DELETE", "/v1/namespaces/otherns", None, SHOP)
    assert status == 403, reply
    status, reply = call(f, "POST", "/v1/namespaces",
                         {"name": "x", "pool": "main", "team": "other"}, SHOP)
    assert status == 403, reply
    status, reply = call(f, "POST", "/v1/pools", {"name": "p2", "nodes": ["127.0.0.1:1"]}, SHOP)
    assert status == 403, reply
    assert group_state(ctls) == before
    assert leader.metrics()["shoal_control_changes_applied_total"] == 3


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef"])
def test_write_through_follower_without_a_good_token_is_401(auth_group, token):
    leader, f, ctls = auth_group
    before = group_state(ctls)
    forwarded = f.metrics()["shoal_control_writes_forwarded_total"]
    for method, path, body in (("POST", "/v1/namespaces", {"name": "x", "pool": "main"}),
                               ("PUT", "/v1/namespaces/shopns", {"memory": 2 << 20}),
                               ("DELETE", "/v1/namespaces/otherns", None),
                               ("POST", "/v1/pools", {"name": "p2", "nodes": ["127.0.0.1:1"]})):
        status, reply = call(f, method, path, body, token)
        assert status == 401 and reply["field"] == "authorization", (method, path, reply)
    assert group_state(ctls) == before
    assert f.metrics()["shoal_control_writes_forwarded_total"] == forwarded


def test_etcd_member_kill9_changes_nothing(group, etcd_cluster):
    ctls = group(2)
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    assert f.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    etcd_cluster.kill9(0)  # the member every process asks first
    for c in (f, leader, f):
        status, body = c.post("/v1/namespaces", {"name": f"n{uuid.uuid4().hex[:6]}",
                                                 "pool": "main"})
        assert status == 201, body
    for c in ctls:
        wait_until(lambda: c.version() == 4, timeout=3, message="version 4 everywhere")
    assert is_leader(leader) and not is_leader(f)


def test_deposed_leader_write_is_refused_by_the_guard(group, etcd_cluster, start_control):
    """The leader's key vanishes (its lease lost) while the leader has not noticed yet: its next
    write is refused by etcd's guard and changes nothing, anywhere."""
    slow = group(1, "--etcd-poll-ms", "10000", "--etcd-lease-ttl", "60")[0]
    wait_until(lambda: is_leader(slow), timeout=10, message="the slow process to lead")
    assert slow.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    other = group(1)[0]
    wait_until(lambda: other.version() == 1, timeout=3, message="the follower at version 1")
    etcd_cluster.delete(group.prefix + "leader")
    status, body = slow.post("/v1/namespaces", {"name": "stale", "pool": "main"})
    assert status == 503, body
    assert body["field"] == "state" and "leader" in body["error"]
    assert slow.metrics()["shoal_control_deposed_refusals_total"] == 1
    assert "stale" not in stored_namespaces(etcd_cluster, group.prefix)
    # the other process is elected and writes; the deposed one then forwards to it
    wait_until(lambda: is_leader(other), timeout=5, message="the other process to lead")
    status, body = other.post("/v1/namespaces", {"name": "fresh", "pool": "main"})
    assert status == 201 and body["version"] == 2
    wait_until(lambda: not is_leader(slow), timeout=15, message="the deposed leader to step down")
    status, body = slow.post("/v1/namespaces", {"name": "later", "pool": "main"})
    assert status == 201 and body["version"] == 3
    assert ns_names(other) >= {"fresh", "later"} and "stale" not in ns_names(other)


def test_stopped_leader_past_its_lease_cannot_overwrite_the_new_one(group):
    """SIGSTOP the leader past its lease: another is elected and writes; the old one's change,
    sent while it was stopped, is either refused or goes to the new leader: it never replaces
    the new leader's state, and no version goes back."""
    ctls = group(3)
    old = one_leader(ctls)
    assert old.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    rest = followers(ctls, old)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        new = wait_until(lambda: next((c for c in rest if is_leader(c)), None), timeout=10,
                         interval=0.05, message="a new leader while the old one is stopped")
        status, body = new.post("/v1/namespaces", {"name": "fresh", "pool": "main"})
        assert status == 201, body
        fresh_version = body["version"]
        result = {}

        def send():
            try:
                result["reply"] = old.post("/v1/namespaces", {"name": "late", "pool": "main"})
            except OSError as e:
                result["reply"] = (0, str(e))

        t = threading.Thread(target=send, daemon=True)
        t.start()
        wait_until(lambda: queued_request(old.port), timeout=5,
                   message="the change to reach the stopped process's socket")
    finally:
        old.proc.send_signal(signal.SIGCONT)
    t.join(20)
    status, body = result["reply"]
    assert status in (201, 503), body
    if status == 201:  # forwarded after it noticed: applied by the new leader, after "fresh"
        assert body["version"] > fresh_version
    wait_until(lambda: not is_leader(old), timeout=10, message="the old leader to step down")
    final = new.topology()
    assert "fresh" in final["namespaces"]
    assert ("late" in final["namespaces"]) == (status == 201)
    for c in ctls:
        wait_until(lambda: c.version() == final["version"], timeout=3,
                   message="every process at the new leader's version")
        assert "fresh" in ns_names(c)


def test_only_the_leader_pushes_and_a_new_leader_takes_over(group, start_server):
    from mcraw import free_port, http
    admin_port = free_port()
    node = start_server("--admin-port", str(admin_port))

    def node_memory():
        status, body = http(admin_port, "GET", "/v1/namespaces/catalog")
        return json.loads(body)["memory"] if status == 200 else None

    ctls = group(2)
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    assert f.post("/v1/pools", {"name": "main", "nodes": [
        {"node": f"127.0.0.1:{node.port}", "admin": f"127.0.0.1:{admin_port}"}]})[0] == 201
    assert f.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                     "memory": 8 << 20})[0] == 201
    wait_until(lambda: node_memory() == 8 << 20, timeout=5, message="the leader's push")
    assert f.metrics()["shoal_control_pushes_total"] == 0
    leader.kill9()
    wait_until(lambda: is_leader(f), timeout=10, message="the follower to lead")
    assert f.put("/v1/namespaces/catalog", {"memory": 12 << 20})[0] == 200
    wait_until(lambda: node_memory() == 12 << 20, timeout=5, message="the new leader's push")
    assert f.metrics()["shoal_control_pushes_total"] >= 1


def test_restarted_process_rejoins_as_follower_at_the_stored_version(group):
    ctls = group(2)
    leader = one_leader(ctls)
    f = followers(ctls, leader)[0]
    assert leader.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    leader.kill9()
    wait_until(lambda: is_leader(f), timeout=10, message="the follower to lead")
    assert f.post("/v1/namespaces", {"name": "after", "pool": "main"})[0] == 201
    again = group(1)[0]
    assert again.version() == 2 and "after" in ns_names(again)  # read from etcd at start
    assert not is_leader(again) and is_leader(f)
    status, body = again.post("/v1/namespaces", {"name": "via-restarted", "pool": "main"})
    assert status == 201 and body["version"] == 3
    wait_until(lambda: f.version() == 3, timeout=3, message="version 3 on the leader")


def test_writes_during_a_followers_shutdown_get_503_and_it_exits_cleanly(group):
    import http.client
    for round_ in range(3):
        ctls = group(2)
        leader = one_leader(ctls)
        f = followers(ctls, leader)[0]
        answers, done = [], threading.Event()

        def write(k):
            i = 0
            while not done.is_set():
                i += 1
                try:
                    answers.append(f.post("/v1/namespaces",
                                          {"name": f"r{round_}t{k}n{i}", "pool": "main"}))
                except (OSError, http.client.HTTPException):
                    if not f.alive():
                        return
        status, body = leader.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})
        assert status in (201, 409), body
        ts = [threading.Thread(target=write, args=(k,), daemon=True) for k in range(3)]
        for t in ts:
            t.start()
        wait_until(lambda: len(answers) >= 3, message="writes through the follower")
        f.proc.send_signal(signal.SIGTERM)
        status = f.proc.wait(10)
        done.set()
        for t in ts:
            t.join(10)
        err = f.stderr_text()
        assert status == 0 and "Sanitizer" not in err and "runtime error" not in err, err
        for st, body in answers:
            assert st == 201 or st == 503, (st, body)
        leader.stop()


def test_namespaces_are_stored_in_buckets_and_a_change_writes_one(group, etcd_cluster):
    """The state key holds no namespaces (10,000 would pass etcd's 1.5 MiB request limit): they
    are spread over buckets, and a namespace change rewrites only its own bucket."""
    ctl = group(1)[0]
    wait_until(lambda: is_leader(ctl), timeout=10, message="the process to lead")
    assert ctl.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    for i in range(20):
        assert ctl.post("/v1/namespaces", {"name": f"n{i}", "pool": "main"})[0] == 201
    head = json.loads(etcd_cluster.get(group.prefix + "state"))
    assert "namespaces" not in head and head["version"] == 21
    buckets = stored_buckets(etcd_cluster, group.prefix)
    assert len(buckets) == head["namespace_buckets"]
    assert set(stored_namespaces(etcd_cluster, group.prefix)) == {"default"} | {
        f"n{i}" for i in range(20)}
    home = next(k for k, (_, nss) in buckets.items() if "n3" in nss)
    assert ctl.put("/v1/namespaces/n3", {"default_ttl": 77})[0] == 200
    after = stored_buckets(etcd_cluster, group.prefix)
    changed = {k for k in buckets if after[k][0] != buckets[k][0]}
    assert changed == {home}
    assert after[home][1]["n3"]["default_ttl"] == 77


def test_state_of_the_one_key_layout_is_read_and_rewritten_split(etcd_cluster, start_control):
    """A state stored by an earlier shoal-control (namespaces inside the state key) is served as
    it is, and the first change stores it split."""
    from etcdharness import b64
    prefix = f"/shoal-test-{uuid.uuid4().hex[:8]}/"
    first = start_control("--etcd", etcd_cluster.urls, "--etcd-prefix", prefix)
    wait_until(lambda: is_leader(first), timeout=10, message="the process to lead")
    assert first.post("/v1/pools", {"name": "main", "nodes": ["127.0.0.1:21001"]})[0] == 201
    assert first.post("/v1/namespaces", {"name": "old", "pool": "main"})[0] == 201
    model = json.loads(etcd_cluster.get(prefix + "state"))
    model.pop("namespace_buckets")
    model["namespaces"] = stored_namespaces(etcd_cluster, prefix)
    first.stop()
    etcd_cluster.call("/v3/kv/deleterange", {"key": b64(prefix + "ns/"),
                                             "range_end": b64(prefix + "ns0")})
    etcd_cluster.call("/v3/kv/put", {"key": b64(prefix + "state"),
                                     "value": b64(json.dumps(model))})
    ctl = start_control("--etcd", etcd_cluster.urls, "--etcd-prefix", prefix)
    wait_until(lambda: is_leader(ctl), timeout=10, message="the new process to lead")
    assert ns_names(ctl) == {"default", "old"} and ctl.version() == 2
    assert ctl.post("/v1/namespaces", {"name": "new", "pool": "main"})[0] == 201
    assert "namespaces" not in json.loads(etcd_cluster.get(prefix + "state"))
    assert set(stored_namespaces(etcd_cluster, prefix)) == {"default", "old", "new"}
