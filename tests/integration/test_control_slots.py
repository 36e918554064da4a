"""Slot maps through shoal-control's API (issue 13.3): every pool's map is explicit and within
one slot of even; adding a node to a pool of N moves only the slots it takes, about
16384/(N+1) (within 1%), none between old nodes; removing a node moves only its slots."""

import pytest


def owners(doc, pool="main"):
    """slot -> node address, from the topology document's explicit map."""
    out = [None] * 16384
    for r in doc["pools"][pool]["slots"]:
        for s in range(r["from"], r["to"] + 1):
            assert out[s] is None, f"slot {s} twice"
            out[s] = r["node"]
    assert None not in out, "a slot without a node"
    return out


def assert_even(own, nodes):
    counts = {n: 0 for n in nodes}
    for o in own:
        counts[o] += 1
    lo = 16384 // len(nodes)
    assert all(lo <= c <= lo + 1 for c in counts.values()), counts


def addr(i):
    return f"127.0.0.1:{22000 + i}"


def test_adding_nodes_one_by_one_moves_only_the_new_nodes_share(start_control):
    ctl = start_control()
    ctl.post("/v1/pools", {"name": "main", "nodes": [addr(0)]})
    nodes = [addr(0)]
    before = owners(ctl.topology())
    for n in range(1, 9):  # N = 1..8 old nodes
        status, body = ctl.post("/v1/pools/main/nodes", {"node": addr(n)})
        assert status == 200, body
        after = owners(ctl.topology())
        moved = [s for s in range(16384) if before[s] != after[s]]
        assert all(after[s] == addr(n) for s in moved), "a slot moved between old nodes"
        assert abs(len(moved) / 16384 - 1 / (n + 1)) <= 0.01 / (n + 1), (n, len(moved))
        assert body["moved"] == len(moved)
        nodes.append(addr(n))
        assert_even(after, nodes)
        before = after


@pytest.mark.parametrize("gone", [0, 2, 4])
def test_removing_a_node_moves_only_its_slots(start_control, gone):
    ctl = start_control()
    nodes = [addr(i) for i in range(5)]
    ctl.post("/v1/pools", {"name": "main", "nodes": nodes})
    before = owners(ctl.topology())
    status, body = ctl.delete(f"/v1/pools/main/nodes/{nodes[gone]}")
    assert status == 200, body
    after = owners(ctl.topology())
    for s in range(16384):
        if before[s] != nodes[gone]:
            assert after[s] == before[s], "a survivor's slot moved"
        else:
            assert after[s] != nodes[gone]
    assert body["moved"] == before.count(nodes[gone])
    survivors = [n for n in nodes if n != nodes[gone]]
    assert_even(after, survivors)
    assert ctl.topology()["pools"]["main"]["nodes"] == survivors


def test_join_then_leave_returns_exactly_the_moved_slots(start_control):
    ctl = start_control()
    nodes = [addr(i) for i in range(3)]
    ctl.post("/v1/pools", {"name": "main", "nodes": nodes})
    first = owners(ctl.topology())
    ctl.post("/v1/pools/main/nodes", {"node": addr(3)})
    mid = owners(ctl.topology())
    ctl.delete(f"/v1/pools/main/nodes/{addr(3)}")
    final = owners(ctl.topology())
    assert_even(final, nodes)
    for s in range(16384):
        if mid[s] != addr(3):
            assert final[s] == first[s], "a slot the joiner never held moved"


def test_new_pool_map_is_design_default(start_control):
    ctl = start_control()
    nodes = [addr(i) for i in range(7)]
    ctl.post("/v1/pools", {"name": "main", "nodes": nodes})
    own = owners(ctl.topology())
    for s in range(0, 16384, 37):
        i = next(i for i in range(7) if i * 16384 // 7 <= s < (i + 1) * 16384 // 7)
        assert own[s] == nodes[i]
