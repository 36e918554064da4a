"""Delete hold-off (the cold-cluster warm-up guard of the memcache paper, §4.3): after
`delete <key> <seconds>` or `md <key> H<seconds>`, for that long gets miss and add, replace,
append, prepend and cas fail, while a plain set succeeds and ends the hold. shoal only:
memcached 1.6.18 refuses a delete time."""

import pytest

from mcraw import wait_until

pytestmark = pytest.mark.shoal_only


def test_text_delete_with_time_holds_the_key_off(raw):
    raw.store("set", "k", b"old")
    assert raw.cmd("delete k 30") == "DELETED"
    assert raw.get("k") == []
    assert raw.store("add", "k", b"stale") == "NOT_STORED", "a racing stale add must fail"
    assert raw.store("replace", "k", b"x") == "NOT_STORED"
    assert raw.store("append", "k", b"x") == "NOT_STORED"
    assert raw.store("prepend", "k", b"x") == "NOT_STORED"
    assert raw.cmd("cas k 0 0 1 1\r\nx") == "NOT_FOUND"
    assert raw.cmd("incr k 1") == "NOT_FOUND"
    assert raw.cmd("touch k 10") == "NOT_FOUND"
    assert raw.get("k") == []


def test_set_ends_the_hold_off(raw):
    assert raw.cmd("delete k 30") == "NOT_FOUND", "nothing was there, but the hold is set"
    assert raw.store("add", "k", b"x") == "NOT_STORED"
    assert raw.store("set", "k", b"fresh") == "STORED"
    assert raw.get("k")[0][2] == b"fresh"
    assert raw.cmd("delete k") == "DELETED"
    assert raw.store("add", "k", b"again") == "STORED", "a plain delete holds nothing off"


def test_hold_off_ends_by_itself(raw):
    # 2 s, not 1: times are whole seconds, so a 1 s hold may end a moment after it is set
    assert raw.cmd("delete k 2") == "NOT_FOUND"
    assert raw.store("add", "k", b"x") == "NOT_STORED"
    wait_until(lambda: raw.store("add", "k", b"late") == "STORED", timeout=6,
               message="add to succeed once the 2 s hold-off is over")
    assert raw.get("k")[0][2] == b"late"


def test_meta_delete_with_hold_off(raw):
    assert raw.meta("ms k 3", b"old").code == "HD"
    assert raw.meta("md k H30 k O7").line == "HD kk O7"
    assert raw.meta("mg k v").code == "EN"
    assert raw.meta("ms k 1 ME", b"x").code == "NS", "meta add is held off too"
    assert raw.meta("ms k 1 MR", b"x").code == "NS"
    assert raw.meta("ms k 1", b"y").code == "HD"
    assert raw.meta("mg k v").value == b"y"


def test_no_lease_or_autocreate_during_hold_off(raw):
    assert raw.meta("md k H30").code == "NF"
    r = raw.meta("mg k v c N30")
    assert r.code == "EN", f"no placeholder (and no W) while held off: {r.line}"
    assert raw.meta("ma k N30 J5 v").code == "NS", "ma must not create the key while held off"


def test_bad_hold_off_token_is_an_error(raw):
    assert raw.meta("md k Habc").line.startswith("CLIENT_ERROR")
    assert raw.cmd("delete k -5").startswith("CLIENT_ERROR")
