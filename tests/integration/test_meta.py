"""Meta protocol (mg, ms, md, ma, mn, me) over raw sockets: every flag, return codes, quiet mode,
opaque and key echo, flag order and base64 keys. Lease and stale-while-revalidate flows are in
test_leases.py."""

import base64
import re

import pytest

from mcraw import wait_until


def b64(s):
    return base64.b64encode(s if isinstance(s, bytes) else s.encode()).decode()


# --- mg ---------------------------------------------------------------------------------------------

def test_mg_miss_is_EN(raw):
    assert raw.meta("mg nope").line == "EN"
    assert raw.meta("mg nope v").line == "EN"


def test_mg_hit_without_flags_is_HD(raw):
    raw.meta("ms k 2", b"hi")
    assert raw.meta("mg k").line == "HD"


def test_mg_v_returns_value(raw):
    raw.meta("ms k 5", b"hello")
    r = raw.meta("mg k v")
    assert (r.code, r.size, r.value, r.flag_list) == ("VA", 5, b"hello", []), \
        "v turns HD into VA <len> with the data block; v itself is not echoed"


def test_mg_s_returns_size(raw):
    raw.meta("ms k 5", b"hello")
    assert raw.meta("mg k s").line == "HD s5"


def test_mg_f_returns_client_flags(raw):
    raw.store("set", "k", "x", flags=1234)
    assert raw.meta("mg k f").line == "HD f1234"


def test_mg_t_returns_remaining_ttl(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k t").line == "HD t-1", "no expiry is reported as t-1"
    raw.meta("ms k 1 T100", b"x")
    assert 98 <= int(raw.meta("mg k t").flags["t"]) <= 100


def test_mg_c_returns_cas_matching_gets(raw):
    raw.store("set", "k", "x")
    cas = raw.get("k", cmd="gets")[0][3]
    assert raw.meta("mg k c").line == f"HD c{cas}"


def test_mg_k_returns_key(raw):
    raw.meta("ms some-key 1", b"x")
    assert raw.meta("mg some-key k").line == "HD ksome-key"


def test_mg_O_echoes_opaque(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k Oabc123").line == "HD Oabc123"


def test_mg_miss_echoes_opaque_and_key(raw):
    # A miss still carries O and k back, so quiet pipelines can be matched up.
    assert raw.meta("mg nope Oxy k").line == "EN Oxy knope"


def test_mg_opaque_length_limit(raw):
    # protocol.txt says "up to 32 bytes", but memcached 1.6.18 refuses 32 and accepts 31.
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k O" + "o" * 31).line == "HD O" + "o" * 31
    assert raw.meta("mg k O" + "o" * 32).line == "CLIENT_ERROR opaque token too long"


def test_mg_h_reports_hit_before(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k h").line == "HD h0", "h reports whether the item was fetched BEFORE this mg"
    assert raw.meta("mg k h").line == "HD h1"


def test_mg_l_reports_seconds_since_last_access(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k l").line == "HD l0"
    wait_until(lambda: int(raw.meta("mg k l u").flags["l"]) >= 1, timeout=4,
               message="l to reach 1 s (read with u so the access time is not reset)")
    # Not asserted: that a read resets l. memcached applies the access-time bump asynchronously
    # (l went 2, 1, 0 over three reads in the same second), so only growth is pinned.


def test_mg_u_does_not_mark_as_fetched(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k h u").line == "HD h0"
    assert raw.meta("mg k h").line == "HD h0", "an mg with u must not count as a fetch"
    assert raw.meta("mg k h").line == "HD h1"


def test_mg_T_updates_ttl(raw):
    raw.meta("ms k 1 T1000", b"x")
    assert raw.meta("mg k T50 t").line == "HD t50", "T is applied before t is reported"
    assert raw.meta("mg k t").line == "HD t50"


def test_mg_flags_echoed_in_request_order(raw):
    cas = raw.meta("ms k 2 F7 c", b"hi").cas
    r = raw.meta("mg k s v f t c k h l O123")
    assert r.line == f"VA 2 s2 f7 t-1 c{cas} kk h0 l0 O123"
    r = raw.meta("mg k O9 k c t v s f")
    assert r.line == f"VA 2 O9 kk c{cas} t-1 s2 f7"


def test_mg_P_and_L_are_ignored(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("mg k P/path L/route v").line == "VA 1"


def test_mg_quiet_hit_still_answers(raw):
    # In memcached 1.6.18 q on mg only hides EN; a hit is answered (HD or VA).
    raw.meta("ms k 1", b"x")
    raw.send("mg k q\r\nmg k q v\r\nmg nope q\r\nmn\r\n")
    assert raw.read_line() == "HD"
    assert raw.read_meta().value == b"x"
    assert raw.read_line() == "MN", "the miss must be silent"


@pytest.mark.parametrize("flags,error", [
    ("v v", "CLIENT_ERROR duplicate flag"),
    ("k O1 k", "CLIENT_ERROR duplicate flag"),
    ("zz", "CLIENT_ERROR invalid flag"),
    ("!", "CLIENT_ERROR invalid flag"),
    ("Tabc", "CLIENT_ERROR bad token in command line format"),
    ("Nabc", "CLIENT_ERROR bad token in command line format"),
    ("Rabc", "CLIENT_ERROR bad token in command line format"),
])
def test_mg_bad_flags(raw, flags, error):
    raw.meta("ms k 1", b"x")
    assert raw.meta(f"mg k {flags}").line == error
    assert raw.meta("mn").code == "MN", "the connection stays usable after a flag error"


def test_mg_without_key_is_error(raw):
    assert raw.cmd("mg") == "ERROR"


# --- ms ---------------------------------------------------------------------------------------------

def test_ms_stores(raw):
    assert raw.meta("ms k 5", b"hello").line == "HD"
    assert raw.get("k") == [("k", 0, b"hello", None)], "ms items are visible to the text protocol"


def test_ms_c_returns_new_cas(raw):
    r = raw.meta("ms k 1 c", b"x")
    assert r.code == "HD"
    assert raw.meta("mg k c").cas == r.cas


def test_ms_F_sets_client_flags(raw):
    raw.meta("ms k 1 F99", b"x")
    assert raw.get("k")[0][1] == 99
    raw.meta("ms k 1", b"x")
    assert raw.get("k")[0][1] == 0, "without F the flags are 0"


def test_ms_T_sets_ttl(raw):
    raw.meta("ms k 1 T100", b"x")
    assert 98 <= int(raw.meta("mg k t").flags["t"]) <= 100


def test_ms_k_and_O_echoed_in_request_order(raw):
    r = raw.meta("ms k 1 O9 k c", b"x")
    assert re.fullmatch(r"HD O9 kk c\d+", r.line), r.line
    r = raw.meta("ms k 1 c k O9", b"x")
    assert re.fullmatch(r"HD c\d+ kk O9", r.line), r.line


def test_ms_quiet_hides_HD_only(raw):
    raw.send("ms k 1 q\r\nx\r\nms k 1 q ME\r\ny\r\nms nope 1 q MR\r\ny\r\nmn\r\n")
    assert raw.read_line() == "NS", "a quiet add of an existing key still answers NS"
    assert raw.read_line() == "NS", "a quiet replace of a missing key still answers NS"
    assert raw.read_line() == "MN"


def test_ms_C_compare_and_swap(raw):
    cas = raw.meta("ms k 1 c", b"1").cas
    assert raw.meta(f"ms k 1 C{cas + 1000}", b"2").line == "EX", "a wrong CAS is refused with EX"
    assert raw.meta(f"ms k 1 C{cas}", b"3").line == "HD"
    assert raw.get("k")[0][2] == b"3"
    assert raw.meta("ms nope 1 C1", b"x").line == "NF", "a CAS store on a missing key is NF"


def test_ms_c_on_failure_returns_zero_cas(raw):
    # memcached 1.6.18 answers `EX c0` when c is asked and the CAS compare fails.
    cas = raw.meta("ms k 1 c", b"1").cas
    assert raw.meta(f"ms k 1 c C{cas + 1}", b"2").line == "EX c0"


@pytest.mark.parametrize("mode,code", [("E", "HD"), ("A", "NS"), ("P", "NS"), ("R", "NF"),
                                       ("S", "NF")])
def test_ms_C_on_a_miss_answers_by_mode(raw, mode, code):
    # memcached: a CAS turns set and replace into cas (NF on a miss); add ignores it; append
    # and prepend need an item
    assert raw.meta(f"ms k 1 M{mode} C1", b"x").line == code


def test_ms_append_C0_does_not_compare(raw):
    raw.meta("ms k 1", b"a")
    assert raw.meta("ms k 1 MA C0", b"b").line == "HD"
    assert raw.meta("mg k v").value == b"ab"


def test_ms_I_with_C0_is_refused_not_stored_stale(raw):
    # C0 is no CAS older than the item's: memcached answers EX
    raw.meta("ms k 1", b"a")
    assert raw.meta("ms k 1 I C0", b"b").line == "EX"


@pytest.mark.parametrize("mode", ["MA", "MP"])
def test_ms_I_does_not_turn_a_failed_append_cas_into_a_stale_store(raw, mode):
    older = raw.meta("ms k 1 c", b"a").cas
    raw.meta("ms k 1", b"a")
    assert raw.meta(f"ms k 1 {mode} C{older} I", b"b").line == "EX"
    assert raw.meta("mg k v").value == b"a"


def test_ms_quiet_cas_failures_still_answer(raw):
    cas = raw.meta("ms k 1 c", b"1").cas
    raw.send(f"ms k 1 q C{cas + 1}\r\nx\r\nms nope 1 q C1\r\nx\r\nmn\r\n")
    assert [raw.read_line() for _ in range(3)] == ["EX", "NF", "MN"]


@pytest.mark.parametrize("mode,exists,code,value", [
    ("E", True, "NS", b"old"),      # add
    ("E", False, "HD", b"new"),
    ("A", True, "HD", b"oldnew"),   # append
    ("A", False, "NS", None),
    ("P", True, "HD", b"newold"),   # prepend
    ("P", False, "NS", None),
    ("R", True, "HD", b"new"),      # replace
    ("R", False, "NS", None),
    ("S", True, "HD", b"new"),      # set
    ("S", False, "HD", b"new"),
])
def test_ms_modes(raw, mode, exists, code, value):
    if exists:
        raw.meta("ms k 3", b"old")
    assert raw.meta(f"ms k 3 M{mode}", b"new").line == code
    got = raw.get("k")
    assert (got[0][2] if got else None) == value


def test_ms_append_respects_cas(raw):
    cas = raw.meta("ms k 1 c", b"a").cas
    assert raw.meta(f"ms k 1 MA C{cas + 5}", b"b").line == "EX"
    assert raw.meta(f"ms k 1 MA C{cas}", b"b").line == "HD"
    assert raw.get("k")[0][2] == b"ab"


def test_ms_invalid_mode(raw):
    raw.send("ms k 3 MX\r\nabc\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR invalid mode for ms M token"
    assert raw.read_line() == "MN", "the data block of a refused ms is swallowed"
    assert raw.get("k") == []


@pytest.mark.memcached_only("shoal accepts newer memcached's S flag on ms (docs/protocol.md)")
def test_ms_S_flag_is_invalid(raw):
    # Older drafts took the length as an S flag; 1.6.18 takes it positionally and refuses S.
    raw.send("ms k 2 S2\r\nhi\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR invalid flag"
    assert raw.read_line() == "MN"


def test_ms_unknown_flag_swallows_data(raw):
    raw.send("ms k 2 !\r\nhi\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR invalid flag"
    assert raw.read_line() == "MN"


def test_ms_bad_token_swallows_data(raw):
    raw.send("ms k 1 Tabc\r\ny\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad token in command line format"
    assert raw.read_line() == "MN"


def test_ms_bad_length_does_not_swallow(raw):
    # With an unparseable length there is nothing to swallow: the data line is a command (ERROR).
    raw.send("ms k abc\r\ny\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR bad command line format"
    assert raw.read_line() == "ERROR"
    assert raw.read_line() == "MN"


def test_ms_missing_length(raw):
    assert raw.cmd("ms k") == "CLIENT_ERROR bad command line format"


def test_ms_I_without_C_is_plain_set(raw):
    raw.meta("ms k 3", b"old")
    assert raw.meta("ms k 3 I", b"new").line == "HD"
    r = raw.meta("mg k v")
    assert (r.value, r.flag_list) == (b"new", []), "I without C stores normally, not stale"


# --- md ---------------------------------------------------------------------------------------------

def test_md_hit_and_miss(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("md k").line == "HD"
    assert raw.meta("md k").line == "NF"
    assert raw.meta("mg k").line == "EN"


def test_md_quiet_hides_HD_but_not_NF(raw):
    raw.meta("ms k 1", b"x")
    raw.send("md k q\r\nmd k q\r\nmn\r\n")
    assert raw.read_line() == "NF", "memcached 1.6.18 shows NF even in quiet mode"
    assert raw.read_line() == "MN"


def test_md_C_compare(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    assert raw.meta(f"md k C{cas + 1}").line == "EX"
    assert raw.meta("mg k").code == "HD", "a refused delete leaves the item"
    assert raw.meta(f"md k C{cas}").line == "HD"
    assert raw.meta("mg k").code == "EN"


def test_md_quiet_EX_still_answers(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    raw.send(f"md k q C{cas + 1}\r\nmn\r\n")
    assert raw.read_line() == "EX"
    assert raw.read_line() == "MN"


def test_md_k_and_O_echo(raw):
    raw.meta("ms k 1", b"x")
    assert raw.meta("md k O9 k").line == "HD O9 kk"
    assert raw.meta("md k k O9").line == "NF kk O9", "echo happens on a miss too"


def test_md_I_marks_stale_and_bumps_cas(raw):
    cas = raw.meta("ms k 3 c", b"old").cas
    assert raw.meta("md k I").line == "HD"
    r = raw.meta("mg k v c")
    assert r.value == b"old", "md I keeps the value"
    assert "X" in r.flags, "the item is stale"
    assert r.cas > cas, "md I gives the item a new CAS"


def test_md_I_T_updates_ttl(raw):
    raw.meta("ms k 1 T1000", b"x")
    assert raw.meta("md k I T30").line == "HD"
    assert 28 <= int(raw.meta("mg k t").flags["t"]) <= 30


def test_md_T_without_I_just_deletes(raw):
    raw.meta("ms k 1 T1000", b"x")
    assert raw.meta("md k T30").line == "HD"
    assert raw.meta("mg k").line == "EN"


def test_md_I_on_missing_key(raw):
    assert raw.meta("md nope I").line == "NF"


def test_md_I_with_wrong_cas(raw):
    cas = raw.meta("ms k 1 c", b"x").cas
    assert raw.meta(f"md k I C{cas + 1}").line == "EX"
    r = raw.meta("mg k c")
    assert (r.cas, "X" in r.flags) == (cas, False), "a refused md I changes nothing"


# --- ma ---------------------------------------------------------------------------------------------

def test_ma_miss_is_NF(raw):
    assert raw.meta("ma nope").line == "NF"


def test_ma_default_increments_by_one(raw):
    raw.meta("ms n 1", b"5")
    assert raw.meta("ma n").line == "HD"
    assert raw.get("n")[0][2] == b"6"


def test_ma_v_returns_new_value(raw):
    raw.meta("ms n 2", b"10")
    r = raw.meta("ma n v")
    assert (r.line, r.value) == ("VA 2", b"11")


@pytest.mark.parametrize("mode,expect", [("I", b"15"), ("+", b"15"), ("D", b"5"), ("-", b"5")])
def test_ma_modes_and_delta(raw, mode, expect):
    raw.meta("ms n 2", b"10")
    assert raw.meta(f"ma n v D5 M{mode}").value.strip() == expect


def test_ma_invalid_mode(raw):
    raw.meta("ms n 1", b"1")
    assert raw.meta("ma n MX").line == "CLIENT_ERROR invalid mode for ma M token"


@pytest.mark.parametrize("delta", ["abc", "-1"])
def test_ma_invalid_delta(raw, delta):
    # Note the message differs from mg's bad-token message.
    raw.meta("ms n 1", b"1")
    assert raw.meta(f"ma n D{delta}").line == "CLIENT_ERROR invalid or duplicate flag"


def test_ma_decrement_stops_at_zero(raw):
    raw.meta("ms n 1", b"3")
    assert raw.meta("ma n v MD D100").value == b"0"


def test_ma_increment_wraps(raw):
    raw.meta("ms n 20", str(2**64 - 1).encode())
    assert raw.meta("ma n v").value == b"0"
    assert raw.meta("mg n v").value == b"0" + b" " * 19, "rewritten in place, space padded"


def test_ma_non_numeric(raw):
    raw.meta("ms s 3", b"abc")
    assert raw.meta("ma s").line == "CLIENT_ERROR cannot increment or decrement non-numeric value"


def test_ma_N_creates_on_miss_with_J_initial(raw):
    r = raw.meta("ma n N0 J10 v")
    assert (r.line, r.value) == ("VA 2", b"10"), "a created counter starts at J, without delta"
    assert raw.meta("ma n v").value == b"11"


def test_ma_N_default_initial_is_zero_and_sets_ttl(raw):
    r = raw.meta("ma n N30 v t")
    assert (r.value, r.flags["t"]) == (b"0", "30")


def test_ma_J_without_N_is_ignored(raw):
    assert raw.meta("ma n J5 v").line == "NF"


def test_ma_J_max_u64(raw):
    assert raw.meta(f"ma n N0 J{2**64 - 1} v").value == str(2**64 - 1).encode()


def test_ma_t_reports_ttl_before_T_update(raw):
    # Surprising: in one ma, t reports the TTL *before* T is applied (mg does the opposite).
    raw.meta("ms n 1", b"1")
    r = raw.meta("ma n v t T60")
    assert r.flags["t"] == "-1", "t shows the old TTL (none) in the same command"
    assert raw.meta("ma n t").flags["t"] == "60", "T60 was applied"


def test_ma_t_after_T_reports_new_ttl(raw):
    # flags act in the order given, as in memcached: T before t shows the new TTL
    raw.meta("ms n 1", b"1")
    assert raw.meta("ma n T60 t").flags["t"] in ("60", "59")


def test_ma_t_before_N_on_a_created_counter_is_minus_one(raw):
    assert raw.meta("ma n t N100").flags["t"] == "-1", "N sets the TTL only where it stands"
    assert raw.meta("ma n t").flags["t"] in ("100", "99")


def test_ma_quiet_still_answers_when_N_creates(raw):
    raw.send("ma n N0 J3 q\r\nma n q\r\nma n q v\r\nmn\r\n")
    assert raw.read_line() == "HD", "memcached answers the creation even under q"
    assert raw.read_line() == "MN", "q hides a hit's HD and its VA alike"


def test_ma_empty_value_is_non_numeric_whatever_the_cas(raw):
    raw.meta("ms n 0", b"")
    assert raw.meta("ma n C1").line == \
        "CLIENT_ERROR cannot increment or decrement non-numeric value"


def test_ma_C0_does_not_compare(raw):
    raw.meta("ms n 1", b"5")
    assert raw.meta("ma n C0 v").value == b"6"


def test_mg_N_created_placeholder_counts_as_fetched(raw):
    raw.meta("mg a N100")
    assert raw.meta("mg a h").flags["h"] == "1", "the creating mg fetched it (memcached's h)"
    raw.meta("mg b N100 u")
    assert raw.meta("mg b h").flags["h"] == "0", "unless it asked for no update (u)"


def test_ma_c_returns_new_cas(raw):
    old = raw.meta("ms n 1 c", b"1").cas
    r = raw.meta("ma n c")
    assert r.cas != old
    assert raw.meta("mg n c").cas == r.cas


def test_ma_C_compare(raw):
    cas = raw.meta("ms n 1 c", b"1").cas
    assert raw.meta(f"ma n C{cas + 1} v").line == "EX"
    assert raw.meta(f"ma n C{cas} v").value == b"2"


def test_ma_quiet_hides_HD_not_NF(raw):
    raw.meta("ms n 1", b"1")
    raw.send("ma n q\r\nma nope q\r\nmn\r\n")
    assert raw.read_line() == "NF"
    assert raw.read_line() == "MN"
    assert raw.get("n")[0][2] == b"2"


def test_ma_k_and_O_echo(raw):
    raw.meta("ms n 1", b"4")
    assert raw.meta("ma n k O9 v").line == "VA 1 kn O9"


# --- mn / me ----------------------------------------------------------------------------------------

def test_mn(raw):
    assert raw.cmd("mn") == "MN"


def test_mn_ignores_arguments(raw):
    assert raw.cmd("mn foo") == "MN"


def test_me_miss(raw):
    assert raw.cmd("me nope") == "EN"


def test_me_hit_fields(raw):
    cas = raw.meta("ms k 5 c", b"hello").cas
    line = raw.cmd("me k")
    assert line.startswith("ME k "), line
    fields = dict(kv.split("=", 1) for kv in line.split(" ")[2:])
    for name in ("exp", "la", "cas", "fetch", "cls", "size"):
        assert name in fields, f"me lacks {name}: {line}"
    assert fields["exp"] == "-1", "no expiry shows as exp=-1"
    assert fields["cas"] == str(cas)
    assert fields["fetch"] == "no", "never read yet"
    assert int(fields["size"]) >= 5 and int(fields["cls"]) >= 1


def test_me_prints_a_binary_key_base64_however_asked(raw):
    # as memcached: an item stored by ms ... b is shown in its stored (base64) form, without b
    assert raw.meta("ms bnVt 2 b", b"aa").line == "HD"
    assert raw.cmd("me num").startswith("ME bnVt "), "asked in plain text"
    assert raw.cmd("me bnVt b").startswith("ME bnVt "), "asked in base64"
    raw.meta("ms num 1", b"x")  # a plain store makes the stored form plain
    assert raw.cmd("me bnVt b").startswith("ME num ")


def test_me_fetch_becomes_yes_after_read(raw):
    raw.meta("ms k 1", b"x")
    raw.meta("mg k v")
    assert "fetch=yes" in raw.cmd("me k")


def test_me_does_not_count_as_fetch(raw):
    raw.meta("ms k 1", b"x")
    raw.cmd("me k")
    assert "fetch=no" in raw.cmd("me k")


def test_me_exp_sign_is_inverted(raw):
    # memcached 1.6.18 prints exp as (now - exptime): an item with 100 s left shows exp=-100 (or
    # -99), not 100. Pinned for compatibility.
    raw.meta("ms k 1 T100", b"x")
    fields = dict(kv.split("=", 1) for kv in raw.cmd("me k").split(" ")[2:])
    assert -100 <= int(fields["exp"]) <= -98, f"expected exp of about -100, got {fields['exp']}"


# --- quiet pipelines --------------------------------------------------------------------------------

def test_quiet_pipeline_with_mn(raw):
    raw.meta("ms hit 3", b"abc")
    raw.send("mg hit q v O1\r\n"        # hit: answered
             "mg miss q v O2\r\n"       # miss: suppressed
             "ms new 1 q O3\r\nx\r\n"   # stored: suppressed
             "md miss q O4\r\n"         # not found: shown
             "ma miss q O5\r\n"         # not found: shown
             "mg hit q Tx O6\r\n"       # error: always shown
             "md new q O7\r\n"          # deleted: suppressed
             "mn\r\n")
    want = (b"VA 3 O1\r\nabc\r\n"
            b"NF O4\r\n"
            b"NF O5\r\n"
            b"CLIENT_ERROR bad token in command line format\r\n"
            b"MN\r\n")
    assert raw.read_exact(len(want)) == want
    assert raw.meta("mg new").line == "EN", "the quiet md did delete"


def test_opaque_matches_pipelined_replies(raw):
    for i in range(5):
        raw.meta(f"ms k{i} 1", str(i).encode())
    raw.send("".join(f"mg k{i} v O{i * 11}\r\n" for i in range(5)))
    for i in range(5):
        r = raw.read_meta()
        assert (r.flags["O"], r.value) == (str(i * 11), str(i).encode())


# --- base64 keys ------------------------------------------------------------------------------------

def test_base64_key_round_trip(raw):
    key = b"bin\x00key\xff\r\n"
    enc = b64(key)
    assert raw.meta(f"ms {enc} 3 b", b"val").line == "HD"
    r = raw.meta(f"mg {enc} b k v")
    assert r.value == b"val"
    assert r.flags["k"] == enc, "k returns the key base64-encoded"
    assert "b" in r.flags, "b is returned to say the key is base64"


def test_base64_key_is_the_decoded_key(raw):
    raw.meta(f"ms {b64('abc')} 1 b", b"Q")
    assert raw.get("abc") == [("abc", 0, b"Q", None)], "the stored key is the decoded bytes"
    raw.store("set", "plain", "P")
    assert raw.meta(f"mg {b64('plain')} b v").value == b"P"


def test_base64_b_flag_follows_k_in_reply(raw):
    # In memcached 1.6.18 the b flag is emitted right after k, wherever b was in the request.
    enc = b64("abc")
    r = raw.meta(f"ms {enc} 1 b k c O5", b"x")
    assert re.fullmatch(rf"HD k{enc} b c\d+ O5", r.line), r.line
    assert raw.meta(f"mg {enc} b k v c f s O1 t").line.startswith(f"VA 1 k{enc} b c")
    assert raw.meta(f"md {enc} k O55 b").line == f"HD k{enc} b O55"
    assert raw.meta(f"md {enc} k O55 b").line == f"NF k{enc} b O55"


def test_base64_miss_echoes_key(raw):
    enc = b64("nothing")
    assert raw.meta(f"mg {enc} b v k").line == f"EN k{enc} b"


def test_base64_ma(raw):
    enc = b64("n")
    assert raw.meta(f"ma {enc} b v N0 J5 k").line == f"VA 1 k{enc} b"


@pytest.mark.parametrize("cmd,error", [
    ("mg YW!j b v", "CLIENT_ERROR error decoding key"),
    ("mg YWJ b v", "CLIENT_ERROR error decoding key"),
    ("md m b", "CLIENT_ERROR invalid or duplicate flag"),
    ("ma m b", "CLIENT_ERROR invalid or duplicate flag"),
    ("me g b", "CLIENT_ERROR bad command line format"),
])
def test_base64_invalid_key(raw, cmd, error):
    # Each command words the same failure differently in memcached 1.6.18.
    assert raw.cmd(cmd) == error
    assert raw.cmd("mn") == "MN"


def test_base64_invalid_key_ms_swallows_data(raw):
    raw.send("ms o 1 b\r\nx\r\nmn\r\n")
    assert raw.read_line() == "CLIENT_ERROR error decoding key"
    assert raw.read_line() == "MN"


def test_me_base64_key_prints_decoded_key(raw):
    # protocol.txt says the response key is base64 too; 1.6.18 prints the decoded key.
    raw.store("set", "g", "x")
    assert raw.cmd(f"me {b64('g')} b").startswith("ME g ")
