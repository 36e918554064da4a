"""TTL rules on the wire: 0 = never, up to 30 days relative, above that absolute unix time, negative
= already expired. Expiry is awaited by polling with a deadline, never a fixed sleep."""

import time

from mcraw import wait_until

THIRTY_DAYS = 60 * 60 * 24 * 30


def ttl_of(raw, key):
    reply = raw.meta(f"mg {key} t")
    assert reply.code == "HD", f"{key} should exist, mg answered {reply.line!r}"
    return int(reply.flags["t"])


def test_exptime_zero_never_expires(raw):
    raw.store("set", "k", "v", exptime=0)
    assert ttl_of(raw, "k") == -1, "mg t reports -1 for an item without expiry"


def test_relative_ttl_expires(raw):
    raw.store("set", "k", "v", exptime=2)
    assert raw.get("k") != [], "an item with a 2 s TTL is there right after the set"
    t0 = time.monotonic()
    wait_until(lambda: raw.get("k") == [], timeout=5, message="the 2 s item to expire")
    assert time.monotonic() - t0 >= 0.5, "a 2 s TTL must not expire almost at once"


def test_relative_ttl_reported_by_mg(raw):
    raw.store("set", "k", "v", exptime=100)
    assert 98 <= ttl_of(raw, "k") <= 100


def test_thirty_days_is_still_relative(raw):
    raw.store("set", "k", "v", exptime=THIRTY_DAYS)
    ttl = ttl_of(raw, "k")
    assert THIRTY_DAYS - 2 <= ttl <= THIRTY_DAYS, f"2592000 is relative (30 days); mg t says {ttl}"


def test_thirty_days_plus_one_is_absolute_and_in_the_past(raw):
    # 2592001 is read as a unix time (1970-01-31), long past: the item is expired at once.
    assert raw.store("set", "k", "v", exptime=THIRTY_DAYS + 1) == "STORED"
    assert raw.get("k") == []


def test_absolute_unix_time_in_future(raw):
    raw.store("set", "k", "v", exptime=int(time.time()) + 100)
    ttl = ttl_of(raw, "k")
    assert 97 <= ttl <= 101, f"an absolute exptime 100 s ahead should show ~100 s left, got {ttl}"


def test_absolute_unix_time_expires(raw):
    raw.store("set", "k", "v", exptime=int(time.time()) + 2)
    assert raw.get("k") != []
    wait_until(lambda: raw.get("k") == [], timeout=5, message="the absolute-time item to expire")


def test_absolute_unix_time_in_past_is_expired(raw):
    assert raw.store("set", "k", "v", exptime=int(time.time()) - 100) == "STORED"
    assert raw.get("k") == []


def test_negative_exptime_expires_immediately(raw):
    assert raw.store("set", "k", "v", exptime=-1) == "STORED", "a negative exptime is accepted"
    assert raw.get("k") == [], "a negative exptime means already expired"


def test_negative_exptime_on_existing_key_removes_it(raw):
    raw.store("set", "k", "old")
    raw.store("set", "k", "new", exptime=-1)
    assert raw.get("k") == [], "storing with a negative exptime replaces and expires the key"


def test_touch_negative_expires(raw):
    raw.store("set", "k", "v")
    assert raw.cmd("touch k -1") == "TOUCHED"
    assert raw.get("k") == []


def test_touch_extends_ttl(raw):
    raw.store("set", "k", "v", exptime=2)
    raw.cmd("touch k 100")
    assert ttl_of(raw, "k") >= 98, "touch should have replaced the 2 s TTL with 100 s"


def test_touch_zero_removes_expiry(raw):
    raw.store("set", "k", "v", exptime=100)
    raw.cmd("touch k 0")
    assert ttl_of(raw, "k") == -1


def test_expired_item_cannot_be_touched(raw):
    raw.store("set", "k", "v", exptime=-1)
    assert raw.cmd("touch k 100") == "NOT_FOUND"


def test_add_succeeds_over_expired_item(raw):
    raw.store("set", "k", "old", exptime=-1)
    assert raw.store("add", "k", "new") == "STORED", "an expired item counts as absent for add"
    assert raw.get("k")[0][2] == b"new"


def test_meta_set_ttl(raw):
    assert raw.meta("ms k 1 T100", b"x").code == "HD"
    assert 98 <= ttl_of(raw, "k") <= 100


def test_meta_set_negative_ttl_expires(raw):
    assert raw.meta("ms k 1 T-1", b"x").code == "HD"
    assert raw.meta("mg k v").code == "EN"
