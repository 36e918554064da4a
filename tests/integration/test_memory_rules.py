"""The memory rules of issue 11, points 1 and 4, as a client sees them, whatever the engine:
no eviction while live items use less than 90% of -m (of the quota in a namespace), items are
kept right after STORED, and memory follows a new working set that fits.

Every test also runs against memcached (SHOAL_TEST_SERVER=memcached); the namespace ones are
shoal-only. Sizes come from fixed-seed RNGs, log-uniform (as many 10-100 B values as 10-100 KB
ones), so a failure reproduces. Each assertion message carries the measured figures.
"""

import math
import os
import random
import shutil
import subprocess
import time

import pytest

from mcraw import accepts, free_port, http, sanitized, wait_until
from memload import VALUE_MAX, Bulk, Churn, LiveSet, Pool, batches, item_overhead, log_uniform, \
    set_frame

MB = 1 << 20
LIVE_HIGH_WATER = 0.88  # of -m: the churn tests keep live bytes (server's count) at or below this


def memcached_fails(reason):
    """Skip for the reference where memcached 1.6.18 itself breaks the rule (measured figures in
    the reason): the rule is issue 11's, stricter than memcached."""
    return pytest.mark.skipif(os.environ.get("SHOAL_TEST_SERVER") == "memcached",
                              reason=f"memcached 1.6.18 fails this rule too: {reason}")


def node_stats(server):
    with server.raw() as r:
        st = r.stats()
    return {n: int(st[n]) for n in ("curr_items", "evictions", "bytes", "limit_maxbytes",
                                    "total_items")}


def ns_stats(server, ns):
    with server.raw() as r:
        st = r.stats("namespaces")
    return {k.split(":", 2)[2]: v for k, v in st.items() if k.startswith(f"ns:{ns}:")}


def admin_node(start_server, *flags):
    port = free_port()
    srv = start_server(*flags, "--admin-port", str(port))
    wait_until(lambda: accepts(port), timeout=5, message="the admin port to accept connections")
    srv.admin = port
    return srv


def make_quota(node, name, nbytes):
    st, body = http(node.admin, "PUT", f"/v1/namespaces/{name}", {"memory": nbytes})
    assert st in (200, 201), body


def spread_sizes(rng, lo, hi, n, step=1.08):
    """n distinct sizes from lo to hi in random order: lo..hi cut into steps of 8% (86 for
    300 B .. 230 KB), n of them chosen at random, a size within a tenth of a step of each chosen
    step's middle. No two sizes are closer than about 6%, near the finest spacing of a slab
    allocator's classes (shoal's factor 1.08; memcached's is 1.25), so the mix lands in as many
    classes as a mix of that range can, as a user's objects of every size do; independent
    log-uniform picks crowd some classes and spare others (seed 27's 70 fell in 60 of main's)."""
    steps = int(math.log(hi / lo) / math.log(step))
    picked = rng.sample(range(steps), n)
    return [int(lo * step ** (i + 0.5 + rng.uniform(-0.1, 0.1))) for i in picked]


# --- point 1: the reproductions -----------------------------------------------------------

def test_seventy_mixed_stores_then_four_tiny_ones_are_all_kept(server):
    """Default flags (-m 64): 70 values of 300 B to 230 KB (2.4 MB in all), then four of 2-3
    bytes. 4% of memory is used: all 74 must be held, with no eviction, as memcached does (main's
    shoal-node evicted 7 here, 10 with the issue's sizes)."""
    # Seed 1250: 70 sizes of 311 B .. 217,092 B, 2,401,724 B in all (the 2.4 MB), each in
    # a class of its own on main's 1.08 table, as the sizes must have been for it to evict
    rng = random.Random(1250)
    sizes = spread_sizes(rng, 300, 230_000, 70)
    values = {f"mixed{i}": rng.randbytes(n) for i, n in enumerate(sizes)}
    values.update({f"tiny{i}": b"t" * (2 + i % 2) for i in range(4)})
    mc = server.client()
    refused = [k for k, v in values.items() if not mc.set(k, v)]
    got = mc.get_many(list(values))
    missing = [k for k in values if k not in got]
    wrong = [k for k in values if k in got and got[k] != values[k]]
    st = node_stats(server)
    assert (refused, missing, wrong, st["curr_items"], st["evictions"]) == ([], [], [], 74, 0), (
        f"stored 74 items ({sum(sizes):,} B of mixed values + 4 tiny) at -m 64: curr_items "
        f"{st['curr_items']}, evictions {st['evictions']}, bytes {st['bytes']:,}; missing "
        f"{len(missing)} {missing[:8]}, wrong {wrong[:8]}, refused {refused[:8]}")


def test_memcslap_mget_load_is_held_without_eviction(server):
    """memcslap's mget test (12,000 keys of its random values, about 31.6 MB on memcached) on a
    fresh -m 64 node: memcached holds all 12,000 with 0 evictions, and so must the node (main's
    shoal-node held 9,343 to 9,644, evicting the rest; memcslap's values differ run to run)."""
    tool = shutil.which("memcslap")
    if tool is None:
        message = "memcslap not installed: apt-get install libmemcached-tools (scripts/deps.sh)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    run = subprocess.run([tool, f"--servers=127.0.0.1:{server.port}", "--test=mget",
                          "--execute-number=12000"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    st = node_stats(server)
    assert st["total_items"] == 12000, f"memcslap stored {st['total_items']} items, not 12,000"
    assert (st["curr_items"], st["evictions"]) == (12000, 0), (
        f"after memcslap --test=mget -e 12000 at -m 64: curr_items {st['curr_items']}, evictions "
        f"{st['evictions']}, bytes {st['bytes']:,} of {st['limit_maxbytes']:,}")


def test_items_stored_after_a_mixed_history_are_kept_right_after_stored(server):
    """A node that has seen 80 sizes (50 B .. 1 MB, two items each, 17 MB) keeps storing values of
    random sizes: each one, and the ten stored before it, must be readable right after its
    STORED. Memory stays under 40% used (main's shoal-node was seen holding 3 items in 64 MB)."""
    b = Bulk(server.host, server.port)
    rng = random.Random(3)
    sizes = [int(50 * (VALUE_MAX / 50) ** (i / 79)) for i in range(80)]
    history = {f"h{i}:{j}": rng.randbytes(n) for i, n in enumerate(sizes) for j in range(2)}
    for chunk in batches(list(history), lambda k: len(history[k])):
        assert b.run([set_frame(k, history[k]) for k in chunk]) == ["STORED"] * len(chunk)
    recent, dropped, total = [], {}, sum(map(len, history.values()))
    for i in range(100):
        key, value = f"after{i}", rng.randbytes(log_uniform(rng, 100, 500_000))
        total += len(value)
        assert b.run([set_frame(key, value)]) == ["STORED"]
        recent = (recent + [(key, value)])[-11:]
        got = b.get_many([k for k, _ in recent])
        for k, v in recent:
            if got.get(k) != v:
                dropped.setdefault(k, i)  # the store after which k was first found gone
    dropped = sorted(dropped.items(), key=lambda kv: kv[1])
    st = node_stats(server)
    b.close()
    assert (dropped, st["evictions"]) == ([], 0), (
        f"{total:,} B stored at -m 64 ({st['bytes']:,} B by the server's count): {len(dropped)} "
        f"items gone within 10 stores of their STORED ((key, store # when found gone): "
        f"{dropped[:10]}); evictions {st['evictions']}, curr_items {st['curr_items']}")


# --- point 1: the rule, with random size mixes ----------------------------------------------------

# Each case: -m, and the value-size windows (log-uniform) of its phases, each phase storing -m's
# worth of values: all sizes, then mostly small, then only large, then all again, so the live set
# is replaced by one size mix after another (the oldest items are deleted to make room). The top
# size is -m/16 or the item limit, whichever is less, so a phase's live set has at least dozens of
# large items; the bottom is 10 B. At -m 1024 the small window starts at 1 KB: 10 B values would
# need tens of millions of requests to move a gigabyte.
RULE_CASES = {
    "m8": (8, [(10, 512 << 10), (10, 4 << 10), (4 << 10, 512 << 10), (10, 512 << 10)]),
    "m64": (64, [(10, VALUE_MAX), (10, 8 << 10), (8 << 10, VALUE_MAX), (10, VALUE_MAX)]),
    "m1024": (1024, [(10, VALUE_MAX), (1 << 10, 64 << 10), (64 << 10, VALUE_MAX)]),
}


def run_rule(bulk, capacity, phases, prefix, bytes_of, seed):
    """Drive the churn below LIVE_HIGH_WATER of `capacity`; returns (churn, report lines, the
    server's highest `bytes` seen after a phase)."""
    rng = random.Random(seed)
    overhead = item_overhead(bulk, bytes_of, key=f"{prefix}probe")
    churn = Churn(bulk, Pool(seed), LiveSet(overhead), rng, LIVE_HIGH_WATER * capacity, prefix)
    lines, peak, t0 = [], 0, time.monotonic()
    for lo, hi in phases:
        churn.phase(lo, hi, capacity)
        server_bytes = bytes_of(bulk)
        peak = max(peak, server_bytes)
        lines.append(f"sizes {lo}..{hi}: written {churn.written / MB:,.0f} MB in "
                     f"{churn.requests:,} requests, live {churn.live.bytes / MB:.1f} MB "
                     f"({len(churn.live.items):,} items) by the client's count, "
                     f"{server_bytes / MB:.1f} MB by the server's")
    lines.append(f"{time.monotonic() - t0:.1f} s, per-item overhead {overhead} B")
    return churn, lines, peak


def check_rule(churn, lines, peak, capacity, evictions, items):
    missing, wrong = churn.verify()
    report = "; ".join(lines)
    assert peak <= 0.9 * capacity, f"test premise broken: server bytes {peak:,} over 90%: {report}"
    live = len(churn.live.items)
    assert (churn.lost, evictions, items, missing, wrong) == ([], 0, live, [], []), (
        f"live bytes kept at or below {LIVE_HIGH_WATER:.0%} of {capacity / MB:.0f} MB: evictions "
        f"{evictions}, items {items} held of {live} live; missing {len(missing)} "
        f"{missing[:5]}, wrong values {len(wrong)}, replies lost {len(churn.lost)} "
        f"{churn.lost[:5]}; {report}")


def rule_at(start_server, megabytes, phases, seed):
    server = start_server("-m", str(megabytes))
    if megabytes > 64 and sanitized(server.proc.pid):
        pytest.skip("3 GB of churn: 33 s and 1.4 GB resident under ASAN; -m 8 and -m 64 run the "
                    "same code")
    bulk = Bulk(server.host, server.port)
    churn, lines, peak = run_rule(bulk, megabytes * MB, phases, "r",
                                  lambda b: int(b.stats()["bytes"]), seed=seed)
    st = node_stats(server)
    lines.append(f"seed {seed}")
    check_rule(churn, lines, peak, megabytes * MB, st["evictions"], st["curr_items"])
    bulk.close()


@memcached_fails("1 MiB pages per size class, so at -m 8 it has fewer pages than the mix has "
                 "classes, and at -m 64 and -m 1024 its slab automover moves pages far slower than "
                 "the mix changes (25, 10,335 and 33,206 evictions)")
@pytest.mark.parametrize("case", RULE_CASES)
def test_no_eviction_while_live_bytes_stay_below_90_percent(start_server, case):
    """SHOAL_RULE_SEED=N runs the case's churn with seed N instead of its own (-m)."""
    megabytes, phases = RULE_CASES[case]
    rule_at(start_server, megabytes, phases, int(os.environ.get("SHOAL_RULE_SEED", megabytes)))


# The -m 8 churn at other seeds: at -m 8 segments are 128 KiB, so most of the churn's bytes are
# in runs of segments and items of nearly a segment, the cases where room is hardest to make.
# Before the fixes of session 7, 17 of seeds 101..160 evicted (1 to 3 items each); all of these
# did but 101, 102 and 103. Seeds 104 and 108 (sizes 4 KB..512 KB only, in the third phase, leave
# every segment part of a run or holding the end of one, most of those ends with nothing after
# them) evicted 2 and 1 until a run could begin after the end of another (docs/architecture.md,
# "Runs"); seeds 101..200 all hold now.
M8_SEEDS = [101, 102, 103, 104, 106, 107, 108, 111, 112, 114, 117, 119, 121, 122, 127]


@memcached_fails("1 MiB pages per size class: at -m 8 it has fewer pages than the mix has classes")
@pytest.mark.parametrize("seed", M8_SEEDS)
def test_no_eviction_below_90_percent_at_m8_for_many_seeds(start_server, seed):
    megabytes, phases = RULE_CASES["m8"]
    rule_at(start_server, megabytes, phases, seed)


@pytest.mark.shoal_only
def test_no_eviction_in_a_quota_while_its_live_bytes_stay_below_90_percent(start_server):
    """A 16 MB namespace in a -m 64 node whose default namespace was filled first (70 MB of mixed
    sizes, evicting there): the same churn inside the namespace evicts nothing of it."""
    node = admin_node(start_server, "-m", "64")
    make_quota(node, "q", 16 * MB)
    bulk = Bulk(node.host, node.port)
    fill = Churn(bulk, Pool(1), LiveSet(0), random.Random(1), float("inf"), "d")
    fill.phase(10, VALUE_MAX, 70 * MB)

    def ns_bytes(b):
        return int(b.stats("namespaces")["ns:q:bytes"])
    phases = [(10, VALUE_MAX), (10, 4 << 10), (4 << 10, VALUE_MAX), (10, VALUE_MAX)]
    churn, lines, peak = run_rule(bulk, 16 * MB, phases, "q:", ns_bytes, seed=16)
    st = ns_stats(node, "q")
    lines.append(f"default namespace: {ns_stats(node, 'default').get('evictions')} evictions")
    check_rule(churn, lines, peak, 16 * MB, int(st["evictions"]), int(st["items"]))
    bulk.close()


# --- point 4: memory follows the working set ------------------------------------------------------

HISTORY_SIZES = [int(64 * (200_000 / 64) ** (i / 68)) for i in range(69)]  # 64 B .. 200 KB
WORKING_SET_KEYS, WORKING_SET_VALUE = 5000, 1540  # 7.7 MB
HIT_TARGET, DEADLINE = 0.995, 15.0


def store_history(bulk, prefix):
    """One megabyte of items (a page's worth on a 1 MiB-page engine) at each of 69 sizes."""
    for i, n in enumerate(HISTORY_SIZES):
        value = bytes([65 + i % 26]) * n
        keys = [f"{prefix}h{i}:{j}" for j in range(-(-MB // n))]
        for chunk in batches(keys, lambda k: n):
            bulk.run([set_frame(k, value) for k in chunk])


def cache_aside_until_full(bulk, prefix):
    """Read the working set round after round, storing each miss, until a round hits at least
    HIT_TARGET or DEADLINE seconds pass. Returns (seconds, hit ratio per round)."""
    keys = [f"{prefix}w{i}" for i in range(WORKING_SET_KEYS)]
    value = b"w" * WORKING_SET_VALUE
    ratios, t0 = [], time.monotonic()
    while True:
        got = bulk.get_many(keys)
        misses = [k for k in keys if k not in got]
        ratios.append(1 - len(misses) / len(keys))
        elapsed = time.monotonic() - t0
        if ratios[-1] >= HIT_TARGET or elapsed > DEADLINE:
            return elapsed, ratios
        for i in range(0, len(misses), 500):
            chunk = misses[i:i + 500]
            bulk.run([set_frame(k, value) for k in chunk])


def describe(ratios):
    shown = ratios if len(ratios) <= 12 else ratios[:6] + ratios[-6:]
    return f"{len(ratios)} rounds, hit ratios {' '.join(f'{r:.1%}' for r in shown)}"


@memcached_fails("its slab automover takes about 34 s here (33.8% hits for 6 s, 90% until 33 s, "
                 "6 pages moved), over the 15 s target")
def test_a_new_working_set_reaches_a_full_hit_ratio_after_many_sizes(server):
    """-m 64 after 69 MB in 69 sizes (64 B .. 200 KB): a 7.7 MB working set of 5,000 keys read
    cache-aside, round after round with no pause, must reach a 99.5% hit ratio within 15 s. A
    fresh node does in its second round; main's shoal-node stayed at 13% (72% in the issue's
    slower loop), memcached took about 34 s (15 s in the issue's)."""
    bulk = Bulk(server.host, server.port)
    store_history(bulk, "")
    elapsed, ratios = cache_aside_until_full(bulk, "")
    st = node_stats(server)
    bulk.close()
    assert ratios[-1] >= HIT_TARGET, (
        f"after {elapsed:.1f} s: {describe(ratios)}; curr_items {st['curr_items']}, bytes "
        f"{st['bytes']:,}, evictions {st['evictions']}")


@pytest.mark.shoal_only
def test_a_new_working_set_reaches_a_full_hit_ratio_in_a_quota(start_server):
    """The same in a 16 MB namespace of a -m 64 node, after the history was stored in both the
    namespace and default: the namespace's working set reaches 99.5% hits within 15 s."""
    node = admin_node(start_server, "-m", "64")
    make_quota(node, "ws", 16 * MB)
    bulk = Bulk(node.host, node.port)
    store_history(bulk, "")
    store_history(bulk, "ws:")
    elapsed, ratios = cache_aside_until_full(bulk, "ws:")
    st = ns_stats(node, "ws")
    bulk.close()
    assert ratios[-1] >= HIT_TARGET, (
        f"after {elapsed:.1f} s: {describe(ratios)}; namespace items {st.get('items')}, bytes "
        f"{st.get('bytes')}, memory {st.get('memory')}, evictions {st.get('evictions')}")
