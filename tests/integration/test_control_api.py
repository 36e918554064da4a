"""shoal-control's HTTP/JSON API (issue 13.1): round trips per endpoint, versions that grow by
one per accepted change, and validation that names the field and the rule and changes nothing."""

import copy

import pytest

NODES = ["127.0.0.1:21001", "127.0.0.1:21002", "127.0.0.1:21003"]


@pytest.fixture
def ctl(start_control):
    c = start_control()
    status, body = c.post("/v1/pools", {"name": "main", "nodes": NODES})
    assert status == 201, body
    return c


def state(ctl):
    """Everything the API shows: the topology, the namespaces and the pools."""
    return ctl.topology(), ctl.get("/v1/namespaces"), ctl.get("/v1/pools")


def test_topology_starts_empty_at_version_zero(start_control):
    ctl = start_control()
    assert ctl.topology() == {"version": 0, "pools": {}, "namespaces": {}, "gutter_ttl": 10}


def test_healthz_answers_ok(start_control):
    ctl = start_control()
    assert ctl.get("/healthz") == (200, "ok\n")


def test_pool_create_round_trip(ctl):
    status, body = ctl.get("/v1/pools/main")
    assert status == 200
    pool = body["pool"]
    assert [n["node"] for n in pool["nodes"]] == NODES
    assert sorted(n["slots"] for n in pool["nodes"]) == [5461, 5461, 5462]
    assert pool["slots"][0] == {"from": 0, "to": 5460, "node": NODES[0]}
    assert pool["namespaces"] == ["default"]  # the first pool gets the default namespace
    assert ctl.get("/v1/pools")[1]["pools"]["main"] == pool


def test_topology_document_has_router_fields(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "team": "shop",
                                "default_ttl": 600, "max_ttl": 86400, "memory": 3 << 20})
    doc = ctl.topology()
    assert doc["version"] == 2
    assert doc["pools"]["main"]["nodes"] == NODES
    covered = sorted((r["from"], r["to"]) for r in doc["pools"]["main"]["slots"])
    assert covered[0][0] == 0 and covered[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:]))
    assert doc["namespaces"]["catalog"] == {
        "pool": "main", "team": "shop", "memory": 3 << 20, "copies": 1, "eviction": "s3fifo",
        "default_ttl": 600, "max_ttl": 86400, "lease_ttl": 0, "stale_ttl": 0, "lease_period": 0,
        "max_value_bytes": 0, "ops_per_sec": 0, "bytes_per_sec": 0}
    assert doc["namespaces"]["default"]["pool"] == "main"


def test_router_accepts_the_whole_document(ctl, start_server, start_router):
    """The router applies the control plane's document as served: pools, slot maps, gutter and
    every namespace field (team "" included), and echoes the namespace fields back."""
    node = start_server()
    ctl.post("/v1/pools", {"name": "g", "nodes": [f"127.0.0.1:{node.port}"], "gutter": True,
                           "gutter_ttl": 5})
    ctl.post("/v1/pools/main/nodes", {"node": f"127.0.0.1:{node.port}"})
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "memory": 3 << 20, "eviction": "lfu"})
    assert status == 201, body
    doc = ctl.topology()
    router, admin, _ = start_router([node])
    from mcraw import http
    import json
    status, body = http(admin, "PUT", "/v1/topology", json.dumps(doc).encode())
    assert status == 200, body
    held = json.loads(body)
    assert held["version"] == doc["version"]
    assert held["namespaces"]["catalog"] == doc["namespaces"]["catalog"]
    assert held["namespaces"]["default"]["team"] == ""


def test_namespace_create_get_list_round_trip(ctl):
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "memory": 3 << 20, "eviction": "lfu",
                                               "copies": 2, "lease_ttl": 10, "stale_ttl": 30,
                                               "lease_period": 2, "ops_per_sec": 1000,
                                               "bytes_per_sec": 10 ** 6,
                                               "max_value_bytes": 4096})
    assert status == 201, body
    assert body["version"] == 2
    ns = body["namespace"]
    assert ns["name"] == "catalog" and ns["eviction"] == "lfu" and ns["copies"] == 2
    assert body["share"] == 2 * (3 << 20) // 3  # copies 2: a primary and a replica share
    status, one = ctl.get("/v1/namespaces/catalog")
    assert status == 200 and one["namespace"] == ns
    status, all_ = ctl.get("/v1/namespaces")
    assert status == 200 and all_["namespaces"]["catalog"] == ns
    assert set(all_["namespaces"]) == {"default", "catalog"}


INVALIDATION = {"tables": {"public.products": ["catalog:product:{id}", "catalog:sku:{sku}"],
                           "shop.orders": ["catalog:order:{id}"]}}


def test_namespace_invalidation_round_trip_into_the_topology(ctl):
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "invalidation": INVALIDATION})
    assert status == 201, body
    assert body["namespace"]["invalidation"] == INVALIDATION
    assert ctl.get("/v1/namespaces/catalog")[1]["namespace"]["invalidation"] == INVALIDATION
    assert ctl.topology()["namespaces"]["catalog"]["invalidation"] == INVALIDATION
    # a namespace without templates has no such field
    assert "invalidation" not in ctl.topology()["namespaces"]["default"]


def test_namespace_invalidation_survives_a_restart(ctl, start_control):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "invalidation": INVALIDATION})
    assert ctl.stop() is None
    again = start_control(data_dir=ctl.data_dir)  # the stored state passes the load's checks
    assert again.get("/v1/namespaces/catalog")[1]["namespace"]["invalidation"] == INVALIDATION


def test_namespace_invalidation_is_replaced_by_put_and_removed_by_null(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "invalidation": INVALIDATION,
                                "max_ttl": 60})
    new = {"tables": {"public.products": ["catalog:item:{id}"]}}
    status, body = ctl.put("/v1/namespaces/catalog", {"invalidation": new})
    assert status == 200, body
    assert body["namespace"]["invalidation"] == new and body["namespace"]["max_ttl"] == 60
    status, body = ctl.put("/v1/namespaces/catalog", {"invalidation": None})
    assert status == 200, body
    assert "invalidation" not in body["namespace"]
    assert "invalidation" not in ctl.topology()["namespaces"]["catalog"]
    assert ctl.version() == 4


def test_default_namespace_templates_may_fix_no_namespace(ctl):
    """In `default` a template may start with a placeholder or hold no ':' before one; one
    that fixes another namespace is refused there too."""
    ok = {"tables": {"public.users": ["user{id}", "default:user:{id}", "{tenant}:u:{id}"]}}
    status, body = ctl.put("/v1/namespaces/default", {"invalidation": ok})
    assert status == 200, body
    status, err = ctl.put("/v1/namespaces/default",
                          {"invalidation": {"tables": {"public.users": ["users:{id}"]}}})
    assert status == 400 and (err["field"], err["rule"]) == (
        "invalidation.tables.public.users[0]", "namespace"), err
    assert "users" in err["error"]


def test_router_accepts_a_document_with_invalidation_templates(ctl, start_server,
                                                               start_router):
    node = start_server()
    ctl.post("/v1/pools/main/nodes", {"node": f"127.0.0.1:{node.port}"})
    status, body = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main",
                                               "invalidation": INVALIDATION})
    assert status == 201, body
    doc = ctl.topology()
    router, admin, _ = start_router([node])
    from mcraw import http
    import json
    status, body = http(admin, "PUT", "/v1/topology", json.dumps(doc).encode())
    assert status == 200, body
    assert json.loads(body)["namespaces"]["catalog"]["invalidation"] == INVALIDATION
    # and refuses a template the control plane would refuse, naming it
    doc["version"] += 1
    doc["namespaces"]["catalog"]["invalidation"] = {"tables": {"public.p": ["users:{id}"]}}
    status, body = http(admin, "PUT", "/v1/topology", json.dumps(doc).encode())
    assert status == 400 and "namespaces.catalog.invalidation.tables.public.p[0]" in body, body


def test_namespace_update_keeps_unsent_fields(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "default_ttl": 60,
                                "team": "shop"})
    status, body = ctl.put("/v1/namespaces/catalog", {"max_ttl": 3600})
    assert status == 200, body
    ns = body["namespace"]
    assert (ns["default_ttl"], ns["max_ttl"], ns["team"]) == (60, 3600, "shop")
    assert body["version"] == 3


def test_namespace_update_of_missing_one_is_404(ctl):
    status, body = ctl.put("/v1/namespaces/nope", {"max_ttl": 5})
    assert status == 404 and body["field"] == "name" and body["rule"] == "exists"


def test_namespace_delete_removes_it(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    status, body = ctl.delete("/v1/namespaces/catalog")
    assert status == 200 and body["deleted"] is True and body["version"] == 3
    assert ctl.get("/v1/namespaces/catalog")[0] == 404
    assert "catalog" not in ctl.topology()["namespaces"]
    assert ctl.delete("/v1/namespaces/catalog")[0] == 404


def test_default_namespace_cannot_be_deleted(ctl):
    status, body = ctl.delete("/v1/namespaces/default")
    assert status == 400 and body["rule"] == "default_kept"
    assert "default" in ctl.topology()["namespaces"]


def test_versions_grow_by_one_per_accepted_change_only(ctl):
    seen = [ctl.version()]
    ctl.post("/v1/namespaces", {"name": "a", "pool": "main"})
    seen.append(ctl.version())
    ctl.post("/v1/namespaces", {"name": "a", "pool": "main"})  # refused: exists
    seen.append(ctl.version())
    ctl.put("/v1/namespaces/a", {"memory": 3 << 20})
    seen.append(ctl.version())
    ctl.post("/v1/pools/main/nodes", {"node": "127.0.0.1:21004"})
    seen.append(ctl.version())
    ctl.delete("/v1/pools/main/nodes/127.0.0.1:21004")
    seen.append(ctl.version())
    ctl.delete("/v1/namespaces/a")
    seen.append(ctl.version())
    assert seen == [1, 2, 2, 3, 4, 5, 6]


# (body fields to send on create, the field the error must name, the rule)
NS_INVALID = [
    ({"name": ""}, "name", "name"),
    ({"name": "a:b"}, "name", "name"),
    ({"name": "x" * 65}, "name", "name"),
    ({"pool": "nope"}, "pool", "exists"),
    ({"pool": 7}, "pool", "type"),
    ({"team": "bad team"}, "team", "name"),
    ({"memory": -1}, "memory", "range"),
    ({"memory": "1m"}, "memory", "range"),
    ({"memory": 1 << 51}, "memory", "range"),
    ({"copies": 0}, "copies", "range"),
    ({"copies": 3}, "copies", "range"),
    ({"eviction": "fifo"}, "eviction", "one_of"),
    ({"default_ttl": 2592001}, "default_ttl", "range"),
    ({"max_ttl": -5}, "max_ttl", "range"),
    ({"default_ttl": 100, "max_ttl": 50}, "default_ttl", "at_most_max_ttl"),
    ({"lease_ttl": 3601}, "lease_ttl", "range"),
    ({"stale_ttl": 86401}, "stale_ttl", "range"),
    ({"lease_period": 3601}, "lease_period", "range"),
    ({"max_value_bytes": (1 << 30) + 1}, "max_value_bytes", "range"),
    ({"ops_per_sec": 10 ** 9 + 1}, "ops_per_sec", "range"),
    ({"bytes_per_sec": (1 << 40) + 1}, "bytes_per_sec", "range"),
    ({"colour": "blue"}, "colour", "unknown_field"),
    # shoal-invalidator's key templates (common/nsfields.h)
    ({"invalidation": ["catalog:p:{id}"]}, "invalidation", "type"),
    ({"invalidation": {"tabels": {}}}, "invalidation.tabels", "unknown_field"),
    ({"invalidation": {"tables": []}}, "invalidation.tables", "type"),
    ({"invalidation": {"tables": {"products": ["catalog:p:{id}"]}}},
     "invalidation.tables.products", "table_name"),
    ({"invalidation": {"tables": {"public.": ["catalog:p:{id}"]}}},
     "invalidation.tables.public.", "table_name"),
    ({"invalidation": {"tables": {"public.p": []}}}, "invalidation.tables.public.p", "type"),
    ({"invalidation": {"tables": {"public.p": ["catalog:p:{id}", 7]}}},
     "invalidation.tables.public.p[1]", "type"),
    ({"invalidation": {"tables": {"public.p": ["catalog:p:{id"]}}},
     "invalidation.tables.public.p[0]", "template"),
    ({"invalidation": {"tables": {"public.p": ["catalog:p"]}}},
     "invalidation.tables.public.p[0]", "template"),
    ({"invalidation": {"tables": {"public.p": ["users:p:{id}"]}}},
     "invalidation.tables.public.p[0]", "namespace"),
    ({"invalidation": {"tables": {"public.p": ["{tenant}:p:{id}"]}}},
     "invalidation.tables.public.p[0]", "namespace"),
    ({"invalidation": {"tables": {"public.p": ["catalog:" + "x" * 600 + "{id}"]}}},
     "invalidation.tables.public.p[0]", "limit"),
    ({"invalidation": {"tables": {"public.p": [f"catalog:{i}:{{id}}" for i in range(17)]}}},
     "invalidation.tables.public.p", "limit"),
    ({"invalidation": {"tables": {f"public.t{i}": ["catalog:{id}"] for i in range(65)}}},
     "invalidation.tables", "limit"),
]


@pytest.mark.parametrize("fields,field,rule", NS_INVALID,
                         ids=[f"{f}-{r}-{i}" for i, (_, f, r) in enumerate(NS_INVALID)])
def test_namespace_create_refusal_names_field_and_rule_and_changes_nothing(ctl, fields, field, rule):
    before = state(ctl)
    body = {"name": "catalog", "pool": "main", **fields}
    status, err = ctl.post("/v1/namespaces", body)
    assert 400 <= status < 500, err
    assert (err["field"], err["rule"]) == (field, rule), err
    assert err["error"]
    assert state(ctl) == before
    assert ctl.metrics()["shoal_control_changes_refused_total"] == 1


@pytest.mark.parametrize("fields,field,rule", [f for f in NS_INVALID if f[1] != "name"],
                         ids=[f"{f}-{r}-{i}" for i, (_, f, r) in enumerate(NS_INVALID) if f != "name"])
def test_namespace_update_refusal_names_field_and_rule_and_changes_nothing(ctl, fields, field, rule):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 3 << 20})
    before = state(ctl)
    status, err = ctl.put("/v1/namespaces/catalog", fields)
    assert 400 <= status < 500, err
    assert (err["field"], err["rule"]) == (field, rule), err
    assert state(ctl) == before


def test_one_bad_field_refuses_the_good_ones_too(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    before = state(ctl)
    status, err = ctl.put("/v1/namespaces/catalog", {"memory": 3 << 20, "copies": 9})
    assert status == 400 and err["field"] == "copies"
    assert state(ctl) == before


def test_missing_pool_on_create_is_refused(ctl):
    status, err = ctl.post("/v1/namespaces", {"name": "catalog"})
    assert status == 400 and (err["field"], err["rule"]) == ("pool", "required")


def test_existing_namespace_cannot_be_created_again(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main", "memory": 3 << 20})
    before = state(ctl)
    status, err = ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    assert status == 409 and (err["field"], err["rule"]) == ("name", "unique")
    assert state(ctl) == before


def test_name_cannot_be_changed_by_put(ctl):
    ctl.post("/v1/namespaces", {"name": "catalog", "pool": "main"})
    status, err = ctl.put("/v1/namespaces/catalog", {"name": "other"})
    assert status == 400 and (err["field"], err["rule"]) == ("name", "immutable")


def test_body_that_is_not_json_is_refused(ctl):
    before = state(ctl)
    status, err = ctl.request("POST", "/v1/namespaces", "{not json")
    assert status == 400 and (err["field"], err["rule"]) == ("body", "json")
    status, err = ctl.request("POST", "/v1/namespaces", "[1, 2]")
    assert status == 400 and (err["field"], err["rule"]) == ("body", "object")
    assert state(ctl) == before


def test_copies_two_needs_two_nodes(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "solo", "nodes": ["127.0.0.1:21001"]})
    status, err = ctl.post("/v1/namespaces", {"name": "r", "pool": "solo", "copies": 2})
    assert status == 409 and (err["field"], err["rule"]) == ("copies", "at_most_nodes")


def test_node_removal_that_would_break_copies_is_refused(ctl):
    ctl.delete(f"/v1/pools/main/nodes/{NODES[2]}")
    ctl.post("/v1/namespaces", {"name": "r", "pool": "main", "copies": 2})
    before = state(ctl)
    status, err = ctl.delete(f"/v1/pools/main/nodes/{NODES[1]}")
    assert status == 409, err
    assert err["rule"] in ("at_most_nodes",) and "copies" in err["field"]
    assert state(ctl) == before


POOL_INVALID = [
    ({"name": "p", "nodes": []}, "nodes", "nonempty"),
    ({"name": "p"}, "nodes", "nonempty"),
    ({"name": "p q", "nodes": ["127.0.0.1:1"]}, "name", "name"),
    ({"name": "p", "nodes": ["127.0.0.1"]}, "nodes[0]", "host_port"),
    ({"name": "p", "nodes": ["127.0.0.1:70000"]}, "nodes[0]", "host_port"),
    ({"name": "p", "nodes": ["127.0.0.1:1", "127.0.0.1:1"]}, "nodes[1]", "unique"),
    ({"name": "p", "nodes": [{"node": "127.0.0.1:1", "admin": "x"}]}, "nodes[0].admin", "host_port"),
    ({"name": "p", "nodes": [{"node": "127.0.0.1:1", "extra": 1}]}, "nodes[0].extra", "unknown_field"),
    ({"name": "main", "nodes": ["127.0.0.1:1"]}, "name", "unique"),
    ({"name": "p", "nodes": ["127.0.0.1:1"], "gutter_ttl": 5}, "gutter_ttl", "gutter_only"),
    ({"name": "p", "nodes": ["127.0.0.1:1"], "gutter": True, "gutter_ttl": 0}, "gutter_ttl", "range"),
    ({"name": "p", "nodes": ["127.0.0.1:1"], "size": 3}, "size", "unknown_field"),
]


@pytest.mark.parametrize("body,field,rule", POOL_INVALID,
                         ids=[f"{f}-{r}-{i}" for i, (_, f, r) in enumerate(POOL_INVALID)])
def test_pool_create_refusal_names_field_and_rule_and_changes_nothing(ctl, body, field, rule):
    before = state(ctl)
    status, err = ctl.post("/v1/pools", body)
    assert 400 <= status < 500, err
    assert (err["field"], err["rule"]) == (field, rule), err
    assert state(ctl) == before


def test_node_add_refusals_name_field_and_rule(ctl):
    before = state(ctl)
    for body, status, field, rule in [
        ({"node": NODES[0]}, 409, "node", "unique"),
        ({"node": "nope"}, 400, "node", "host_port"),
        ({"node": "127.0.0.1:5", "admin": "127.0.0.1:0"}, 400, "admin", "host_port"),
        ({}, 400, "node", "host_port"),
    ]:
        got, err = ctl.post("/v1/pools/main/nodes", body)
        assert (got, err["field"], err["rule"]) == (status, field, rule), (body, err)
    got, err = ctl.post("/v1/pools/nope/nodes", {"node": "127.0.0.1:5"})
    assert (got, err["field"], err["rule"]) == (404, "pool", "exists")
    assert state(ctl) == before


def test_node_remove_refusals(ctl):
    status, err = ctl.delete("/v1/pools/main/nodes/127.0.0.1:9")
    assert (status, err["rule"]) == (404, "exists")
    solo = copy.deepcopy(NODES[:1])
    ctl.post("/v1/pools", {"name": "solo", "nodes": solo})
    status, err = ctl.delete(f"/v1/pools/solo/nodes/{solo[0]}")
    assert (status, err["field"], err["rule"]) == (409, "node", "last_node")


def test_gutter_pool_in_document(ctl):
    status, body = ctl.post("/v1/pools", {"name": "gutter", "nodes": ["127.0.0.1:21009"],
                                          "gutter": True, "gutter_ttl": 7})
    assert status == 201 and body["pool"]["gutter"] is True
    doc = ctl.topology()
    assert (doc["gutter_pool"], doc["gutter_ttl"]) == ("gutter", 7)
    status, err = ctl.post("/v1/pools", {"name": "g2", "nodes": ["127.0.0.1:21010"],
                                         "gutter": True})
    assert (status, err["rule"]) == (409, "one_gutter")


def test_unknown_paths_and_methods(ctl):
    assert ctl.get("/v1/nothing")[0] == 404
    assert ctl.request("PATCH", "/v1/namespaces/default", {})[0] == 405
    assert ctl.request("DELETE", "/v1/pools/main")[0] == 405
    assert ctl.post("/v1/topology")[0] == 405


def test_metrics_count_requests_changes_and_version(ctl):
    ctl.post("/v1/namespaces", {"name": "a", "pool": "main"})
    ctl.post("/v1/namespaces", {"name": "a", "pool": "main"})
    ctl.get("/v1/namespaces")
    ctl.topology()
    m = ctl.metrics()
    assert m["shoal_control_topology_version"] == 2
    assert m["shoal_control_changes_applied_total"] == 2
    assert m["shoal_control_changes_refused_total"] == 1
    assert m["shoal_control_requests_namespaces_total"] == 3
    assert m["shoal_control_requests_pools_total"] == 1
    assert m["shoal_control_requests_topology_total"] == 1
    assert m["shoal_control_state_writes_total"] == 2
