"""Access control on the admin ports (issue 13 point 8): with --auth-file, shoal-control,
shoal-node and shoal-router refuse every admin request that changes something unless it carries
`Authorization: Bearer <token>` of a token in the file (401 with WWW-Authenticate: Bearer, and
nothing changed); a team token may create, change and delete only its team's namespaces on
shoal-control (403 on anything else); GETs, /healthz and /metrics stay open. Control's pushes
and the router's follower send --token-file's token; the shoal CLI sends SHOAL_TOKEN or the token
file `shoal up` writes, and explains a 401."""

import http.client
import json
import os
import subprocess

import pytest

from conftest import REPO_ROOT
from fakecontrol import FakeControl
from mcraw import free_port, wait_until

pytestmark = pytest.mark.shoal_only

ADMIN = "admin-token-0123456789abcdef"
SHOP = "shop-token-0123456789abcdef"
OTHER = "other-token-0123456789abcdef"
WRONG = "wrong-token-0123456789abcdef"
SHOAL = REPO_ROOT / os.environ.get("SHOAL_CLI_BIN", "build/bin/shoal")
MiB = 1 << 20


def call(port, method, path, body=None, token=None, header=None):
    """(status, parsed JSON body or text, headers dict) of one request to 127.0.0.1:port."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if header:
        headers["Authorization"] = header
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read().decode()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()
    try:
        return r.status, json.loads(text) if text else None, hdrs
    except ValueError:
        return r.status, text, hdrs


@pytest.fixture
def auth_file(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"tokens": [
        {"token": ADMIN, "role": "admin", "name": "ops"},
        {"token": SHOP, "team": "shop"},
        {"token": OTHER, "team": "other"},
    ]}))
    path.chmod(0o600)
    return path


@pytest.fixture
def admin_token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(ADMIN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def node(start_server, auth_file):
    admin = free_port()
    n = start_server("--admin-port", str(admin), "--auth-file", str(auth_file))
    n.admin_port, n.addr, n.admin = admin, f"127.0.0.1:{n.port}", f"127.0.0.1:{admin}"

    def admin_up():
        try:
            return call(admin, "GET", "/healthz")[0] == 200
        except OSError:
            return False

    # the data port answers first: the admin listener starts just after it
    wait_until(admin_up, timeout=10, interval=0.02, message="the node's admin port")
    return n


@pytest.fixture
def ctl(start_control, auth_file, node, admin_token_file):
    """A control plane with auth on, pool `main` of one auth-requiring node, and namespaces
    `shopns` (team shop) and `otherns` (team other)."""
    c = start_control("--auth-file", str(auth_file), "--token-file", str(admin_token_file))
    c.node = node
    assert call(c.port, "POST", "/v1/pools", {"name": "main", "nodes": [
        {"node": node.addr, "admin": node.admin}]}, ADMIN)[0] == 201
    assert call(c.port, "POST", "/v1/namespaces", {"name": "shopns", "pool": "main",
                                                    "team": "shop"}, ADMIN)[0] == 201
    assert call(c.port, "POST", "/v1/namespaces", {"name": "otherns", "pool": "main",
                                                    "team": "other"}, ADMIN)[0] == 201
    return c


# every change shoal-control's API takes, each valid for an admin on the `ctl` fixture
CONTROL_WRITES = [
    ("POST", "/v1/namespaces", {"name": "fresh", "pool": "main"}),
    ("PUT", "/v1/namespaces/shopns", {"memory": 4 * MiB}),
    ("DELETE", "/v1/namespaces/otherns", None),
    ("POST", "/v1/pools", {"name": "second", "nodes": ["127.0.0.1:1"]}),
    ("POST", "/v1/pools/main/nodes", {"node": "127.0.0.1:2"}),
    ("DELETE", "/v1/pools/main/nodes/127.0.0.1:2", None),
]


def control_state(c):
    return c.get("/v1/namespaces")[1]["namespaces"], c.get("/v1/pools")[1]["pools"], c.version()


@pytest.mark.parametrize("method,path,body", CONTROL_WRITES)
def test_control_write_without_token_is_401_and_changes_nothing(ctl, method, path, body):
    before = control_state(ctl)
    status, reply, hdrs = call(ctl.port, method, path, body)
    assert status == 401, reply
    assert hdrs["www-authenticate"].startswith("Bearer")
    assert reply["field"] == "authorization" and "Authorization: Bearer" in reply["error"]
    assert control_state(ctl) == before


@pytest.mark.parametrize("method,path,body", CONTROL_WRITES)
def test_control_write_with_unknown_token_is_401_and_changes_nothing(ctl, method, path, body):
    before = control_state(ctl)
    status, reply, hdrs = call(ctl.port, method, path, body, WRONG)
    assert status == 401, reply
    assert 'error="invalid_token"' in hdrs["www-authenticate"]
    assert reply["rule"] == "token"
    assert control_state(ctl) == before


def test_control_write_with_another_scheme_is_401(ctl):
    status, reply, _ = call(ctl.port, "POST", "/v1/namespaces", {"name": "x", "pool": "main"},
                            header=f"Basic {ADMIN}")
    assert status == 401 and reply["rule"] == "bearer"
    assert ctl.get("/v1/namespaces/x")[0] == 404


def test_admin_token_may_make_every_change(ctl):
    for method, path, body in CONTROL_WRITES:
        status, reply, _ = call(ctl.port, method, path, body, ADMIN)
        assert status in (200, 201), (method, path, reply)


def test_team_token_creates_changes_and_deletes_its_own_namespace(ctl):
    status, reply, _ = call(ctl.port, "POST", "/v1/namespaces",
                            {"name": "cart", "pool": "main", "team": "shop"}, SHOP)
    assert status == 201, reply
    status, reply, _ = call(ctl.port, "PUT", "/v1/namespaces/cart", {"memory": 2 * MiB}, SHOP)
    assert status == 200 and reply["namespace"]["memory"] == 2 * MiB, reply
    status, reply, _ = call(ctl.port, "PUT", "/v1/namespaces/shopns",
                            {"default_ttl": 30, "team": "shop"}, SHOP)
    assert status == 200, reply
    status, reply, _ = call(ctl.port, "DELETE", "/v1/namespaces/cart", None, SHOP)
    assert status == 200, reply
    assert ctl.get("/v1/namespaces/cart")[0] == 404


def test_team_token_cannot_create_a_namespace_of_another_team_or_none(ctl):
    before = control_state(ctl)
    status, reply, _ = call(ctl.port, "POST", "/v1/namespaces",
                            {"name": "x", "pool": "main", "team": "other"}, SHOP)
    assert status == 403 and "shop" in reply["error"], reply
    status, reply, _ = call(ctl.port, "POST", "/v1/namespaces", {"name": "x", "pool": "main"},
                            SHOP)
    assert status == 403 and "shop" in reply["error"], reply
    assert control_state(ctl) == before


def test_team_token_cannot_change_or_delete_another_teams_namespace(ctl):
    before = control_state(ctl)
    status, reply, _ = call(ctl.port, "PUT", "/v1/namespaces/otherns", {"memory": MiB}, SHOP)
    assert status == 403 and "shop" in reply["error"] and "other" in reply["error"], reply
    status, reply, _ = call(ctl.port, "DELETE", "/v1/namespaces/otherns", None, SHOP)
    assert status == 403, reply
    assert control_state(ctl) == before


def test_team_token_cannot_give_its_namespace_to_another_team(ctl):
    before = control_state(ctl)
    status, reply, _ = call(ctl.port, "PUT", "/v1/namespaces/shopns", {"team": "other"}, SHOP)
    assert status == 403, reply
    assert control_state(ctl) == before


@pytest.mark.parametrize("method,path,body", CONTROL_WRITES[3:])
def test_team_token_cannot_change_pools_or_nodes(ctl, method, path, body):
    before = control_state(ctl)
    status, reply, _ = call(ctl.port, method, path, body, SHOP)
    assert status == 403, reply
    assert reply["team"] == "shop" and "admin token" in reply["error"]
    assert control_state(ctl) == before


def test_reads_health_and_metrics_stay_open(ctl):
    for path in ("/healthz", "/metrics", "/v1/namespaces", "/v1/namespaces/shopns",
                 "/v1/pools/main", "/v1/topology"):
        assert call(ctl.port, "GET", path)[0] == 200, path
    for port in (ctl.node.admin_port,):
        for path in ("/healthz", "/metrics", "/v1/namespaces"):
            assert call(port, "GET", path)[0] == 200, path


def test_control_pushes_reach_a_node_that_requires_a_token(ctl):
    status, reply, _ = call(ctl.port, "POST", "/v1/namespaces",
                            {"name": "pushed", "pool": "main", "memory": 8 * MiB}, ADMIN)
    assert status == 201, reply
    got = wait_until(lambda: call(ctl.node.admin_port, "GET", "/v1/namespaces/pushed")[0] == 200
                     and call(ctl.node.admin_port, "GET", "/v1/namespaces/pushed")[1],
                     message="the namespace pushed to the node")
    assert got["memory"] == 8 * MiB
    wait_until(lambda: all(n["in_place"] for n in ctl.get("/v1/namespaces/pushed")[1]["nodes"].values()),
               message="the push in place")


def test_control_without_token_file_cannot_push_to_such_a_node(start_control, auth_file, node):
    c = start_control("--auth-file", str(auth_file))
    call(c.port, "POST", "/v1/pools", {"name": "main", "nodes": [
        {"node": node.addr, "admin": node.admin}]}, ADMIN)
    call(c.port, "POST", "/v1/namespaces", {"name": "lost", "pool": "main"}, ADMIN)
    wait_until(lambda: c.metrics().get("shoal_control_push_failures_total", 0) >= 1,
               message="a refused push counted")
    nodes = c.get("/v1/namespaces/lost")[1]["nodes"]
    assert not any(n["in_place"] for n in nodes.values())
    assert call(node.admin_port, "GET", "/v1/namespaces/lost")[0] == 404


# --- shoal-node's admin port ------------------------------------------------------------------

def test_node_write_without_token_is_401_and_changes_nothing(node):
    status, reply, hdrs = call(node.admin_port, "PUT", "/v1/namespaces/n1", {"memory": MiB})
    assert status == 401 and hdrs["www-authenticate"].startswith("Bearer"), reply
    status, reply, _ = call(node.admin_port, "PUT", "/v1/namespaces/n1", {"memory": MiB}, WRONG)
    assert status == 401, reply
    assert call(node.admin_port, "GET", "/v1/namespaces/n1")[0] == 404


def test_node_write_with_team_token_is_403(node):
    status, reply, _ = call(node.admin_port, "PUT", "/v1/namespaces/n1", {"memory": MiB}, SHOP)
    assert status == 403 and reply["team"] == "shop", reply
    assert call(node.admin_port, "GET", "/v1/namespaces/n1")[0] == 404


def test_node_write_with_admin_token_is_applied(node):
    status, reply, _ = call(node.admin_port, "PUT", "/v1/namespaces/n1", {"memory": MiB}, ADMIN)
    assert status in (200, 201), reply
    assert call(node.admin_port, "GET", "/v1/namespaces/n1")[0] == 200
    assert call(node.admin_port, "DELETE", "/v1/namespaces/n1")[0] == 401
    assert call(node.admin_port, "DELETE", "/v1/namespaces/n1", None, ADMIN)[0] == 200
    assert call(node.admin_port, "GET", "/v1/namespaces/n1")[0] == 404


def test_node_refuses_to_start_with_a_bad_auth_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tokens": [{"token": ADMIN, "role": "admin"},
                                          {"token": "short", "team": "shop"}]}))
    p = subprocess.run([str(REPO_ROOT / os.environ.get("SHOAL_NODE_BIN", "build/bin/shoal-node")),
                        "-p", "0", "--admin-port", str(free_port()), "--auth-file", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "tokens[1]" in p.stderr and "16" in p.stderr, p.stderr
    assert "short" not in p.stderr  # a token is never printed


@pytest.mark.parametrize("entry,says", [
    ({"token": ADMIN}, "exactly one of"),
    ({"token": ADMIN, "role": "admin", "team": "shop"}, "exactly one of"),
    ({"token": ADMIN, "role": "root"}, "role must be"),
    ({"token": ADMIN, "team": "bad team"}, "team must be"),
    ({"token": ADMIN, "role": "admin", "extra": 1}, "unknown field"),
    ({"token": SHOP, "team": "shop"}, "the same token"),
])
def test_control_refuses_to_start_with_a_bad_auth_file(tmp_path, entry, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tokens": [{"token": SHOP, "team": "shop"}, entry]}))
    p = subprocess.run([str(REPO_ROOT / os.environ.get("SHOAL_CONTROL_BIN",
                                                       "build/bin/shoal-control")),
                        "-p", "0", "--data-dir", str(tmp_path / "d"), "--auth-file", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "tokens[1]" in p.stderr and says in p.stderr, p.stderr


# --- shoal-router's admin port and follower ------------------------------------------------------

@pytest.fixture
def router(start_server, start_router, auth_file):
    n = start_server()
    r, admin, _ = start_router([n], "--auth-file", str(auth_file))
    r.admin_port = admin
    return r


def router_version(r):
    return call(r.admin_port, "GET", "/v1/topology")[1]["version"]


def test_router_topology_put_needs_an_admin_token(router):
    status, doc, _ = call(router.admin_port, "GET", "/v1/topology")
    assert status == 200
    doc["version"] += 1
    v = router_version(router)
    assert call(router.admin_port, "PUT", "/v1/topology", doc)[0] == 401
    assert call(router.admin_port, "PUT", "/v1/topology", doc, WRONG)[0] == 401
    assert call(router.admin_port, "PUT", "/v1/topology", doc, SHOP)[0] == 403
    assert router_version(router) == v
    status, reply, _ = call(router.admin_port, "PUT", "/v1/topology", doc, ADMIN)
    assert status == 200, reply
    assert router_version(router) == v + 1
    for path in ("/healthz", "/metrics"):
        assert call(router.admin_port, "GET", path)[0] == 200


def test_router_follower_sends_its_token_file(start_server, start_router, admin_token_file):
    n = start_server()
    fake = FakeControl(hold=1.0)
    try:
        fake.publish({"version": 3, "pools": {"main": {"nodes": [f"127.0.0.1:{n.port}"]}},
                      "namespaces": {"default": {"pool": "main"}}})
        r, admin, _ = start_router([n], "--control", fake.url, "--token-file",
                                   str(admin_token_file))
        wait_until(lambda: call(admin, "GET", "/v1/topology")[1]["version"] == 3,
                   message="the router following the control plane")
        assert fake.auths and all(a == f"Bearer {ADMIN}" for a in fake.auths), fake.auths
    finally:
        fake.stop()


def test_router_follows_a_control_plane_with_auth_on(ctl, start_server, start_router,
                                                      admin_token_file):
    r, admin, _ = start_router([start_server()], "--control", f"http://127.0.0.1:{ctl.port}",
                               "--token-file", str(admin_token_file))
    wait_until(lambda: call(admin, "GET", "/v1/topology")[1]["version"] == ctl.version(),
               message="the router at control's version")
    assert call(ctl.port, "POST", "/v1/namespaces",
                {"name": "later", "pool": "main", "team": "shop"}, SHOP)[0] == 201
    wait_until(lambda: "later" in call(admin, "GET", "/v1/topology")[1]["namespaces"],
               message="the team's new namespace reaching the router")


# --- the shoal CLI ----------------------------------------------------------------------------

def cli(*args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if k != "SHOAL_TOKEN"}
    e.update(env or {})
    p = subprocess.run([str(SHOAL), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def test_cli_sends_shoal_token(ctl, tmp_path):
    url = f"http://127.0.0.1:{ctl.port}"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    rc, out, err = cli("ns", "create", "viaenv", "--pool", "main", "--control", url, "--dir",
                       tmp_path, env={**env, "SHOAL_TOKEN": ADMIN})
    assert rc == 0, err
    assert ctl.get("/v1/namespaces/viaenv")[0] == 200


def test_cli_without_token_explains_the_401(ctl, tmp_path):
    url = f"http://127.0.0.1:{ctl.port}"
    cfg = tmp_path / "cfg"
    rc, out, err = cli("ns", "create", "nope", "--pool", "main", "--control", url, "--dir",
                       tmp_path, env={"XDG_CONFIG_HOME": str(cfg)})
    assert rc == 1
    assert "401" in err and "SHOAL_TOKEN" in err and str(cfg / "shoal" / "token") in err, err
    assert ctl.get("/v1/namespaces/nope")[0] == 404


def test_cli_with_team_token_explains_the_403(ctl, tmp_path):
    url = f"http://127.0.0.1:{ctl.port}"
    rc, out, err = cli("ns", "delete", "otherns", "--control", url, "--dir", tmp_path,
                       env={"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "SHOAL_TOKEN": SHOP})
    assert rc == 1
    assert "403" in err and "team shop" in err and "admin token" in err, err
    assert ctl.get("/v1/namespaces/otherns")[0] == 200


def test_shoal_up_makes_a_token_the_cli_then_uses(tmp_path):
    d, cfg = tmp_path / "cluster", tmp_path / "cfg"
    env = {"XDG_CONFIG_HOME": str(cfg)}
    cport = free_port()
    args = ["--dir", d]
    try:
        rc, out, err = cli("up", "--port", free_port(), "--admin-port", free_port(),
                           "--control-port", cport, *args, env=env)
        assert rc == 0, out + err
        token_file = cfg / "shoal" / "token"
        assert str(token_file) in out
        token = token_file.read_text().strip()
        assert len(token) >= 32
        for f in (token_file, d / "auth.json", d / "token"):
            assert f.stat().st_mode & 0o777 == 0o600, f
        # the daemons require it: a write without it is refused
        assert call(cport, "POST", "/v1/namespaces", {"name": "raw", "pool": "main"})[0] == 401
        assert call(cport, "POST", "/v1/namespaces", {"name": "raw", "pool": "main"},
                    token)[0] == 201
        # the CLI finds it in the token file
        rc, out, err = cli("ns", "create", "bycli", "--memory", "8m", *args, env=env)
        assert rc == 0, err
        status, ns, _ = call(cport, "GET", "/v1/namespaces/bycli")
        assert status == 200
        # control pushed the quota to the nodes, which require the token too
        wait_until(lambda: all(n["in_place"] for n in
                               call(cport, "GET", "/v1/namespaces/bycli")[1]["nodes"].values()),
                   timeout=10, message="pushes in place on auth-requiring nodes")
        # without the token file the CLI is refused, and says what to do
        rc, out, err = cli("ns", "create", "refused", *args,
                           env={"XDG_CONFIG_HOME": str(tmp_path / "empty")})
        assert rc == 1 and "401" in err and "SHOAL_TOKEN" in err, err
    finally:
        cli("down", *args, env=env)


# --- admin ports on loopback by default -------------------------------------------------------

def listen_address(port):
    """The local address a socket listening on TCP `port` is bound to ("127.0.0.1", "0.0.0.0")."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":  # LISTEN
                return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return None


def test_admin_ports_listen_on_loopback_by_default(start_server, start_router, start_control):
    n = start_server("--admin-port", str(free_port()))
    admin = int(n.args[n.args.index("--admin-port") + 1])
    _, radmin, _ = start_router([n])
    c = start_control()
    for port in (admin, radmin, c.port):
        wait_until(lambda port=port: listen_address(port), message=f"a listener on {port}")
        assert listen_address(port) == "127.0.0.1", port


def test_control_takes_auth_file_from_its_config_file(start_control, auth_file, tmp_path):
    conf = tmp_path / "control.conf"
    conf.write_text(f"auth_file = {auth_file}\n")
    c = start_control("--config", str(conf))
    assert call(c.port, "POST", "/v1/pools", {"name": "p", "nodes": ["127.0.0.1:1"]})[0] == 401
    assert call(c.port, "POST", "/v1/pools", {"name": "p", "nodes": ["127.0.0.1:1"]},
                ADMIN)[0] == 201
