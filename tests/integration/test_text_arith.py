"""Text protocol: incr / decr on unsigned 64-bit decimal values."""

import pytest

U64_MAX = 2**64 - 1


def test_incr_and_decr(mc):
    mc.set("n", b"10")
    assert mc.incr("n", 5) == 15
    assert mc.decr("n", 3) == 12
    assert mc.get("n") == b"12"


def test_incr_missing_key_not_found(raw):
    assert raw.cmd("incr nope 1") == "NOT_FOUND"
    assert raw.cmd("decr nope 1") == "NOT_FOUND"


def test_incr_wraps_at_2_pow_64(raw):
    raw.store("set", "n", str(U64_MAX - 1))
    assert raw.cmd("incr n 1") == str(U64_MAX)
    assert raw.cmd("incr n 1") == "0", "incr past 2^64-1 wraps around to 0"
    assert raw.cmd(f"incr n {U64_MAX}") == str(U64_MAX), "0 + (2^64-1) = 2^64-1"
    assert raw.cmd("incr n 2") == "1", "(2^64-1) + 2 wraps to 1"


def test_incr_wrap_keeps_length_padded_with_spaces(raw):
    # memcached rewrites a shorter result in place: the value keeps its length and is padded with
    # trailing spaces. `incr` of "18446744073709551615" by 1 answers "0" but `get` then returns
    # "0" followed by 19 spaces.
    raw.store("set", "n", str(U64_MAX))
    assert raw.cmd("incr n 1") == "0"
    assert raw.get("n")[0][2] == b"0" + b" " * 19, "stored value should be '0' padded to 20 bytes"


def test_decr_stops_at_zero(raw):
    raw.store("set", "n", "5")
    assert raw.cmd("decr n 1000") == "0", "decr must not go below 0"
    assert raw.cmd("decr n 1") == "0"


def test_decr_shrinking_value_is_space_padded(raw):
    # decr 100 -> 99 rewrites in place: `get` returns "99 " (3 bytes).
    raw.store("set", "n", "100")
    assert raw.cmd("decr n 1") == "99"
    assert raw.get("n")[0][2] == b"99 "
    assert raw.cmd("incr n 1") == "100", "a space-padded value must still be numeric"


def test_incr_with_length_growth(raw):
    raw.store("set", "n", "99", flags=9)
    assert raw.cmd("incr n 1") == "100"
    assert raw.get("n") == [("n", 9, b"100", None)], "the grown value is 3 bytes and keeps its flags"


def test_incr_changes_cas(raw):
    raw.store("set", "n", "1")
    before = raw.get("n", cmd="gets")[0][3]
    raw.cmd("incr n 1")
    after = raw.get("n", cmd="gets")[0][3]
    assert after != before, "incr must give the item a new CAS"


def test_incr_non_numeric_value(raw):
    raw.store("set", "s", "abc")
    assert raw.cmd("incr s 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"
    assert raw.cmd("decr s 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"
    assert raw.get("s")[0][2] == b"abc", "a refused incr must not change the value"


def test_incr_empty_value_is_non_numeric(raw):
    raw.store("set", "s", "")
    assert raw.cmd("incr s 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"


def test_incr_value_over_u64_is_non_numeric(raw):
    raw.store("set", "s", str(2**64))
    assert raw.cmd("incr s 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"


def test_incr_invalid_delta(raw):
    raw.store("set", "n", "1")
    for delta in ("abc", "-1", str(2**64), "1x"):
        assert raw.cmd(f"incr n {delta}") == "CLIENT_ERROR invalid numeric delta argument", \
            f"delta {delta!r} should be refused"
    assert raw.cmd("decr n abc") == "CLIENT_ERROR invalid numeric delta argument"


def test_incr_without_delta_is_error(raw):
    assert raw.cmd("incr n") == "ERROR"


def test_incr_decr_noreply(raw):
    raw.store("set", "n", "10")
    raw.send("incr n 5 noreply\r\ndecr n 2 noreply\r\nmn\r\n")
    assert raw.read_line() == "MN", "incr/decr noreply must not answer"
    assert raw.get("n")[0][2].strip() == b"13"


def test_incr_via_pymemcache_missing_returns_none(mc):
    assert mc.incr("nope", 1) is None


@pytest.mark.parametrize("stored,expect", [(b" 09", b"10"), (b"9 x", b"10"), (b"+9", b"10"),
                                           (b"\t9\t", b"10"), (b"-0", b"1"),
                                           (b"-18446744073709551615", b"2")])
def test_incr_reads_the_value_as_strtoull_does(raw, stored, expect):
    # memcached parses the stored value with strtoull: leading white space, a sign, and
    # anything after white space are taken
    raw.store("set", "n", stored)
    assert raw.cmd("incr n 1") == expect.decode()


@pytest.mark.parametrize("stored", [b"-9", b"-", b" ", b"9x"])
def test_incr_refuses_what_strtoull_refuses(raw, stored):
    raw.store("set", "n", stored)
    assert raw.cmd("incr n 1") == "CLIENT_ERROR cannot increment or decrement non-numeric value"
