"""Text protocol: storage and retrieval commands (set/add/replace/append/prepend/cas, get/gets/gat/gats,
delete, touch), through pymemcache where it shows enough and raw sockets where it hides the wire."""

import pytest


# --- set / get -------------------------------------------------------------------------------------

def test_set_then_get_returns_value_and_flags(server):
    mc = server.client()
    assert mc.set("k", b"hello", flags=42) is True, "set should reply STORED"
    assert mc.get("k") == b"hello", "get should return the stored value"
    raw = server.raw()
    assert raw.get("k") == [("k", 42, b"hello", None)], "VALUE line should carry the stored client flags"


def test_set_overwrites_existing_value(mc):
    mc.set("k", b"one")
    mc.set("k", b"two")
    assert mc.get("k") == b"two", "a second set should replace the value"


def test_set_empty_value(raw):
    assert raw.store("set", "empty", b"") == "STORED"
    assert raw.get("empty") == [("empty", 0, b"", None)], "a zero-length value should round trip"


def test_value_with_crlf_and_binary_bytes_round_trips(raw):
    value = b"a\r\nb\x00c\xff\r\n"
    assert raw.store("set", "bin", value) == "STORED"
    assert raw.get("bin")[0][2] == value, "values are opaque bytes, \\r\\n inside included"


def test_get_many_keys_with_misses_in_request_order(raw):
    for k in ("a", "c", "e"):
        raw.store("set", k, k.upper())
    got = raw.get("a", "b", "c", "d", "e")
    assert [(k, v) for k, _, v, _ in got] == [("a", b"A"), ("c", b"C"), ("e", b"E")], \
        "get with many keys returns the hits, in request order, and skips misses"


def test_get_duplicate_keys_returns_each_occurrence(raw):
    raw.store("set", "dup", "x")
    got = raw.get("dup", "miss", "dup", "dup")
    assert [k for k, _, _, _ in got] == ["dup", "dup", "dup"], \
        "memcached answers a key once per occurrence in the request"


def test_get_many_via_pymemcache(mc):
    mc.set_many({"m1": b"1", "m2": b"2"})
    assert mc.get_many(["m1", "m2", "m3"]) == {"m1": b"1", "m2": b"2"}


def test_get_all_misses_is_just_end(raw):
    raw.send("get nope1 nope2\r\n")
    assert raw.read_line() == "END", "a get with only misses should answer END alone"


def test_gets_returns_cas_unique_per_key(raw):
    raw.store("set", "g1", "x")
    raw.store("set", "g2", "y")
    got = raw.get("g1", "g2", "nope", cmd="gets")
    assert [k for k, _, _, _ in got] == ["g1", "g2"]
    cas1, cas2 = got[0][3], got[1][3]
    assert cas1 is not None and cas2 is not None, "gets VALUE lines should carry a CAS unique"
    assert cas1 != cas2, "different items should have different CAS values"


def test_cas_unique_changes_on_every_store(raw):
    raw.store("set", "k", "1")
    cas_a = raw.get("k", cmd="gets")[0][3]
    raw.store("set", "k", "1")
    cas_b = raw.get("k", cmd="gets")[0][3]
    assert cas_b > cas_a, "every store should give the item a new, larger CAS"


def test_get_without_key_is_error(raw):
    assert raw.cmd("get") == "ERROR"


# --- noreply ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd,setup,expect", [
    ("set", None, b"new"),
    ("add", None, b"new"),
    ("replace", b"old", b"new"),
    ("append", b"old", b"oldnew"),
    ("prepend", b"old", b"newold"),
])
def test_storage_noreply_sends_nothing_and_applies(raw, cmd, setup, expect):
    if setup is not None:
        raw.store("set", "nr", setup)
    raw.send(f"{cmd} nr 0 0 3 noreply\r\nnew\r\n")
    raw.send("mn\r\n")
    assert raw.read_line() == "MN", f"{cmd} noreply must not send a reply line"
    assert raw.get("nr")[0][2] == expect


def test_noreply_failure_is_silent_too(raw):
    raw.store("set", "exists", "v")
    raw.send("add exists 0 0 1 noreply\r\nx\r\nreplace missing 0 0 1 noreply\r\nx\r\nmn\r\n")
    assert raw.read_line() == "MN", "a failed noreply command must not answer NOT_STORED"
    assert raw.get("exists")[0][2] == b"v", "a failed add must not change the item"
    assert raw.get("missing") == [], "a failed replace must not create the item"


# --- add / replace / append / prepend ---------------------------------------------------------------

def test_add_stores_only_when_absent(mc):
    assert mc.add("a", b"1") is True, "add on a missing key should reply STORED"
    assert mc.add("a", b"2") is False, "add on an existing key should reply NOT_STORED"
    assert mc.get("a") == b"1"


def test_replace_stores_only_when_present(mc):
    assert mc.replace("r", b"1") is False, "replace on a missing key should reply NOT_STORED"
    assert mc.get("r") is None
    mc.set("r", b"0")
    assert mc.replace("r", b"1") is True
    assert mc.get("r") == b"1"


def test_append_and_prepend(mc):
    mc.set("ap", b"mid")
    assert mc.append("ap", b">") is True
    assert mc.prepend("ap", b"<") is True
    assert mc.get("ap") == b"<mid>"


def test_append_prepend_on_missing_key_not_stored(raw):
    assert raw.store("append", "none", "x") == "NOT_STORED"
    assert raw.store("prepend", "none", "x") == "NOT_STORED"
    assert raw.get("none") == []


def test_append_ignores_flags_and_exptime(raw):
    # memcached keeps the item's flags and TTL on append: `append ap 5 100 1` changes neither.
    raw.store("set", "ap", "x", flags=3)
    assert raw.store("append", "ap", "y", flags=5, exptime=100) == "STORED"
    reply = raw.meta("mg ap v f t")
    assert (reply.value, reply.flags["f"], reply.flags["t"]) == (b"xy", "3", "-1"), \
        "append must keep the original flags (3) and TTL (none)"


# --- cas --------------------------------------------------------------------------------------------

def test_cas_succeeds_with_current_unique(mc):
    mc.set("c", b"1")
    value, cas = mc.gets("c")
    assert mc.cas("c", b"2", cas) is True, "cas with the current unique should reply STORED"
    assert mc.get("c") == b"2"


def test_cas_fails_with_stale_unique(mc):
    mc.set("c", b"1")
    _, cas = mc.gets("c")
    mc.set("c", b"other")
    assert mc.cas("c", b"2", cas) is False, "cas after a concurrent store should reply EXISTS"
    assert mc.get("c") == b"other"


def test_cas_on_missing_key_is_not_found(raw):
    assert raw.store("cas", "nokey", "x", extra="12345") == "NOT_FOUND"


def test_cas_noreply(raw):
    raw.store("set", "c", "1")
    cas = raw.get("c", cmd="gets")[0][3]
    raw.send(f"cas c 0 0 1 {cas} noreply\r\n2\r\ncas c 0 0 1 {cas} noreply\r\n3\r\nmn\r\n")
    assert raw.read_line() == "MN", "cas noreply answers neither STORED nor EXISTS"
    assert raw.get("c")[0][2] == b"2", "the first cas should win, the second (stale) one not"


def test_cas_without_unique_is_error(raw):
    assert raw.cmd("cas c 0 0 1") == "ERROR", "cas needs 5 arguments"


# --- delete -----------------------------------------------------------------------------------------

def test_delete_existing_then_missing(raw):
    raw.store("set", "d", "x")
    assert raw.cmd("delete d") == "DELETED"
    assert raw.cmd("delete d") == "NOT_FOUND"
    assert raw.get("d") == []


def test_delete_via_pymemcache(mc):
    mc.set("d", b"x")
    assert mc.delete("d", noreply=False) is True
    assert mc.delete("d", noreply=False) is False


def test_delete_noreply(raw):
    raw.store("set", "d", "x")
    raw.send("delete d noreply\r\ndelete d noreply\r\nmn\r\n")
    assert raw.read_line() == "MN", "delete noreply must answer nothing, hit or miss"
    assert raw.get("d") == []


@pytest.mark.memcached_only("shoal implements the delete hold-off time (docs/protocol.md)")
def test_delete_accepts_legacy_zero_time_but_not_other_times(raw):
    # memcached still accepts the pre-1.4 form `delete <key> 0`; any other number is refused with
    # a usage message (note the two spaces after "format.").
    raw.store("set", "d", "x")
    assert raw.cmd("delete d 0") == "DELETED"
    assert raw.cmd("delete d 5") == \
        "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"


# --- touch / gat / gats -----------------------------------------------------------------------------

def test_touch_hit_and_miss(raw):
    raw.store("set", "t", "x")
    assert raw.cmd("touch t 100") == "TOUCHED"
    assert raw.cmd("touch nope 100") == "NOT_FOUND"
    ttl = int(raw.meta("mg t t").flags["t"])
    assert 98 <= ttl <= 100, f"touch should set the TTL to ~100s, mg t says {ttl}"


def test_touch_via_pymemcache(mc):
    mc.set("t", b"x")
    assert mc.touch("t", 50, noreply=False) is True
    assert mc.touch("nope", 50, noreply=False) is False


def test_touch_noreply(raw):
    raw.store("set", "t", "x")
    raw.send("touch t 100 noreply\r\nmn\r\n")
    assert raw.read_line() == "MN"


def test_gat_returns_values_and_updates_ttl(raw):
    raw.store("set", "g1", "one", flags=7)
    raw.store("set", "g2", "two")
    got = raw.get("100", "g1", "nope", "g2", cmd="gat")
    assert [(k, f, v, c) for k, f, v, c in got] == [("g1", 7, b"one", None), ("g2", 0, b"two", None)], \
        "gat <exptime> <keys...> returns the hits like get"
    for k in ("g1", "g2"):
        ttl = int(raw.meta(f"mg {k} t").flags["t"])
        assert 98 <= ttl <= 100, f"gat should have set {k}'s TTL to ~100s, got {ttl}"


def test_gats_returns_cas(raw):
    raw.store("set", "g", "x")
    cas = raw.get("g", cmd="gets")[0][3]
    got = raw.get("100", "g", cmd="gats")
    assert got == [("g", 0, b"x", cas)], "gats returns the CAS unique like gets"


def test_gat_duplicate_keys_answered_twice(raw):
    raw.store("set", "x", "x")
    assert len(raw.get("10", "x", "x", "nope", cmd="gat")) == 2


def test_gat_without_keys_answers_end(raw):
    # Surprising but memcached 1.6.18: `gat 10` (an exptime and no key) is not an error.
    assert raw.cmd("gat 10") == "END"
    assert raw.cmd("gat") == "ERROR"


def test_gat_miss_only(raw):
    assert raw.cmd("gat 10 nope") == "END"
