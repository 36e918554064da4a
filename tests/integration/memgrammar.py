"""memgrammar.py — a seeded generator of memcache text and meta command sequences, valid and
malformed, for the differential test (test_differential_memcached.py).

A *sequence* is a list of Cmd: the bytes of one request (line plus data block), the tags that
say what was done to it (which command, which mutation), and how it is sent (in one piece with
the commands around it, or split in two sends). Tags let the test recognise the commands that a
known or deliberate difference is about, so it can drop them and look for further differences.

Every choice comes from one random.Random(seed), so a sequence is reproduced from the seed and
its index alone. Keys come from a small pool so commands in a sequence touch the same items; no
TTL lies between 1 and 30 s (an expiry mid-sequence would be a race, not a difference), and no
command sleeps or is delayed (flush_all only without a delay).

Two placeholders are filled in by the runner for each target: CAS_LAST (the last CAS value that
target returned in this sequence, so cas/C<cas> commands can succeed) and nothing else; the
runner syncs (mn) before a command that uses it.
"""

import base64
import random
import re

CAS_LAST = b"\x00CAS\x00"  # replaced per target by the last CAS value that target returned

KEYS = [b"k0", b"k1", b"k2", b"num", b"{t}x"]
MAXKEY = b"K" * 250
LONGKEY = b"L" * 251
CMDLIKE = [b"flush_all", b"get k0", b"set k1 0 0 1\r\nz", b"delete k0", b"mn", b"version",
           b"incr num 1", b"ms k2 1\r\nq", b"verbosity 1"]
TEXT_STORES = [b"set", b"add", b"replace", b"append", b"prepend"]
TIMES = [b"0", b"0", b"0", b"100", b"1000", b"-1", b"2000000000", b"1000000000"]

INT32_MAX = 2**31 - 1
SWALLOW_MAX = 1 << 21  # a swallow longer than this is not generated (see text_store)


def _mc_scan(tok):
    """memcached's strto* scan of a token (docs/protocol.md "Numbers"): (negative, magnitude)
    or None when it does not read."""
    m = re.fullmatch(rb"[ \t-\r]*([+-]?)([0-9]+)(?:[ \t-\r].*)?", tok, re.S)
    if m is None or int(m.group(2)) >= 2**64:
        return None
    return m.group(1) == b"-", int(m.group(2))


def mc_u32(tok):
    """safe_strtoul: the low 32 bits, None for a negative number other than -0."""
    r = _mc_scan(tok)
    if r is None or (r[0] and r[1] != 0):
        return None
    return r[1] & 0xFFFFFFFF


def mc_u64(tok):
    r = _mc_scan(tok)
    if r is None or (r[0] and r[1] != 0):
        return None
    return r[1]


def mc_i32(tok):
    """safe_strtol: the low 32 bits as a signed number."""
    r = _mc_scan(tok)
    if r is None or r[1] > 2**63 - 1 + r[0]:
        return None
    v = (-r[1] if r[0] else r[1]) & 0xFFFFFFFF
    return v - 2**32 if v >= 2**31 else v


def mc_length(tok):
    """A storage line's <bytes> as shoal and memcached read it, or None."""
    if CAS_LAST in tok:
        return "cas"  # known only when the sequence runs: callers avoid it
    v = mc_i32(tok)
    return v if v is not None and 0 <= v <= INT32_MAX - 2 else None


def text_store_swallow(line):
    """How many bytes after a text storage line shoal swallows as a refused store's data block
    (docs/protocol.md: the token count fits, <bytes> reads, and the key, flags, exptime or cas
    unique is refused), or None when it does not (memcached 1.6.18 never does then)."""
    toks = [t for t in line.split(b" ") if t]
    want = 6 if toks[0] == b"cas" else 5
    if len(toks) not in (want, want + 1):
        return None
    n = mc_length(toks[4])
    if n is None:
        return None
    refused = (len(toks[1]) > 250 or mc_u32(toks[2]) is None or mc_i32(toks[3]) is None
               or (want == 6 and CAS_LAST not in toks[5] and mc_u64(toks[5]) is None))
    if not refused:
        return None
    return n if n == "cas" else n + 2


class Cmd:
    """One request. `data` is what shoal gets; `mc_data` (when not None) is what Debian's
    memcached 1.6.18 gets instead, where a rule we follow (current memcached's, or the issue's)
    differs from 1.6.18 in a way that can be emulated by changing the input (a refused store's
    data block, swallowed by us, is simply not sent to 1.6.18). `split` is None or an offset at
    which the bytes are sent in two pieces. `sync`: the runner reads every reply so far first
    (the command uses CAS_LAST)."""

    __slots__ = ("data", "tags", "mc_data", "split", "sync")

    def __init__(self, data, tags, mc_data=None, sync=False):
        self.data, self.tags, self.mc_data, self.split, self.sync = data, set(tags), mc_data, None, sync

    def for_target(self, memcached):
        return self.mc_data if (memcached and self.mc_data is not None) else self.data

    def __repr__(self):
        s = f"Cmd({self.data[:120]!r}{'...' if len(self.data) > 120 else ''}, tags={sorted(self.tags)}"
        if self.mc_data is not None:
            s += f", memcached gets {self.mc_data[:80]!r}"
        if self.split is not None:
            s += f", split at {self.split}"
        return s + ")"


class Grammar:
    def __init__(self, seed):
        self.r = random.Random(seed)

    # -- atoms ------------------------------------------------------------------------------
    def chance(self, p):
        return self.r.random() < p

    def key(self, tags):
        r = self.r.random()
        if r < 0.90:
            return self.r.choice(KEYS)
        if r < 0.93:
            return MAXKEY
        if r < 0.96:
            tags.add("key:long")
            return LONGKEY
        if r < 0.98:
            tags.add("key:ctrl")
            return b"c" + bytes([self.r.choice([1, 7, 0x1b, 0x7f])]) + b"k"
        tags.add("key:high")
        return b"h\xc3\xa9k"

    def value(self):
        r = self.r.random()
        if r < 0.35:
            return str(self.r.choice([0, 1, 7, 42, 99, 18446744073709551615, 18446744073709551614,
                                      9])).encode()
        if r < 0.45:
            return b""
        if r < 0.55:
            return self.r.choice(CMDLIKE)
        if r < 0.60:
            return b"a\r\nb"
        if r < 0.62:
            return b"x" * self.r.choice([2047, 2048, 5000, 70000])
        if r < 0.625:
            return b"y" * 1048577  # too large for -I 1m
        return bytes(self.r.choice(b"abcdefXYZ019 ") for _ in range(self.r.randrange(1, 12)))

    def bad_number(self, tags, kind):
        """A token where a number is expected that memcached refuses (or takes: '+5' is 5,
        4294967296 is 0 in a 32-bit field)."""
        choice = self.r.choice([b"abc", b"-1", b"1.5", b"0x10", b"99999999999999999999999",
                                b"1a", b"+5", b"-", b"4294967296"])
        if choice == b"+5":
            tags.add("num:plus")
        elif choice == b"4294967296" and kind == "flags":
            tags.add("flags:big")
        tags.add(f"bad:{kind}")
        return choice

    def noreply(self, tags, p=0.12):
        if self.chance(p):
            tags.add("noreply")
            return b" noreply"
        return b""

    # -- text commands ----------------------------------------------------------------------
    def text_store(self):
        tags = set()
        verb = self.r.choice(TEXT_STORES + [b"cas"])
        tags.add(f"cmd:{verb.decode()}")
        key = self.key(tags)
        val = self.value()
        flags = self.r.choice([b"0", b"0", b"1", b"4294967295", b"123"])
        exp = self.r.choice(TIMES)
        length = str(len(val)).encode()
        cas = None
        sync = False
        if verb == b"cas":
            if self.chance(0.6):
                cas, sync = CAS_LAST, True
            else:
                cas = self.r.choice([b"1", b"999999999", b"0"])
        r = self.r.random()
        if r < 0.06:
            flags = self.bad_number(tags, "flags")
        elif r < 0.10:
            exp = self.bad_number(tags, "exptime")
        elif r < 0.13:
            length = self.bad_number(tags, "length")
        elif r < 0.17 and verb == b"cas":
            cas = self.r.choice([b"abc", b"-1", b"", b"1x"])
            tags.add("bad:cas")
        elif r < 0.21:
            # declared length differs from the data sent: a bad data chunk, or the data runs on
            length = str(max(0, len(val) + self.r.choice([-2, -1, 1, 2, 5]))).encode()
            tags.add("bad:chunk")
        elif r < 0.24:
            tags.add("missing")
        elif r < 0.27:
            tags.add("extra")
        fields = [verb, key, flags, exp, length] + ([cas] if cas is not None else [])
        if "missing" in tags:
            del fields[self.r.randrange(1, len(fields))]
        if "extra" in tags:
            fields.append(self.r.choice([b"x", b"0", b"noreply", b"1 2"]))
        line = b" ".join(fields) + self.noreply(tags)
        swallow = text_store_swallow(line)
        if swallow == "cas" or (swallow is not None and swallow > SWALLOW_MAX):
            # a field gone and noreply added shifted the cas unique to <bytes>: a length only
            # known when the sequence runs (or a huge one); not generated
            tags.discard("noreply")
            line = b" ".join(fields)
            swallow = text_store_swallow(line)
            assert swallow is None, line
        end = b"\r\n"
        if self.chance(0.03):
            end = b"\n"  # memcached takes a bare LF as a line end
            tags.add("lf")
        trailer = b"\r\n"
        if swallow is None and self.chance(0.03):
            trailer = self.r.choice([b"", b"\n", b"XX", b"\r"])
            tags.add("bad:trailer")
            if trailer == b"\r":
                tags.add("key:ctrl")  # a command-like value ends in "\r" plus the next line
        block = val + trailer
        mc_data = None
        if swallow is not None:
            # shoal swallows the <bytes>+2 bytes after a refused store whose length reads
            # (docs/protocol.md); memcached 1.6.18 runs them as commands, so it does not get
            # them. Where <bytes> reaches past what was sent, shoal gets filler up to it.
            tags.add("store:refused")
            block += b"x" * max(0, swallow - len(block))
            mc_data = line + end + block[swallow:]
        data = line + end + block
        toks = [t for t in line.split(b" ") if t]
        framed = (len(toks) in ((6, 7) if verb == b"cas" else (5, 6))
                  and mc_length(toks[4]) is not None)
        if not framed:
            tags.add("store:malformed")  # no data block: it is read as commands
        if len(val) >= 2048:
            tags.add("value:long")  # read as a command line if the framing slipped before it
        if len(val) >= 2048 and not framed:
            tags.add("line:long")  # the data block is read as a command line
        return Cmd(data, tags, mc_data, sync=sync)

    def retrieval(self):
        tags = set()
        verb = self.r.choice([b"get", b"gets", b"gat", b"gats", b"get", b"gets"])
        tags.add(f"cmd:{verb.decode()}")
        parts = [verb]
        if verb in (b"gat", b"gats"):
            if self.chance(0.1):
                parts.append(self.bad_number(tags, "exptime"))
            else:
                parts.append(self.r.choice(TIMES))
        n = self.r.choice([0, 1, 1, 1, 2, 3, 5]) if not self.chance(0.04) else 0
        if n == 0 and self.chance(0.5):
            tags.add("missing")
        elif n == 0:
            n = self.r.choice([100, 300])  # a long line (300 keys of ~3 bytes: ~1.2 KiB)
            tags.add("get:many")
        for _ in range(n):
            k = self.key(tags)
            if k == LONGKEY and not self.chance(0.2):
                # rarer here: memcached then drops the unsent replies before it (deliberate
                # difference), which would hide whatever else the sequence shows
                k = MAXKEY
            parts.append(k)
        if LONGKEY in parts:
            tags.add("get:longkey")
        if self.chance(0.02):
            head = 2 if verb in (b"gat", b"gats") else 1
            parts = parts[:head] + [b"k%d" % i for i in range(12000)]  # ~80 KiB line
            tags.add("get:long")
        line = b" ".join(parts) + b"\r\n"
        if verb in (b"gat", b"gats") and len(line) > 1024:
            tags.add("gat:long")  # memcached closes a gat line it has 1-2 KiB of unfinished
        return Cmd(line, tags)

    def delete(self):
        tags = {"cmd:delete"}
        parts = [b"delete", self.key(tags)]
        r = self.r.random()
        if r < 0.1:
            parts.append(b"0")
        elif r < 0.14:
            parts.append(self.r.choice([b"5", b"abc", b"-1"]))
            tags.add("delete:time")
        elif r < 0.18:
            del parts[1]
            tags.add("missing")
        elif r < 0.21:
            parts += [b"0", b"x"]
            tags.add("extra")
        return Cmd(b" ".join(parts) + self.noreply(tags) + b"\r\n", tags)

    def arith(self):
        tags = set()
        verb = self.r.choice([b"incr", b"decr"])
        tags.add(f"cmd:{verb.decode()}")
        key = self.r.choice([b"num", b"num", self.key(tags)])
        delta = self.r.choice([b"1", b"0", b"5", b"18446744073709551615", b"100"])
        parts = [verb, key, delta]
        r = self.r.random()
        if r < 0.12:
            parts[2] = self.bad_number(tags, "delta")
        elif r < 0.16:
            del parts[self.r.randrange(1, 3)]
            tags.add("missing")
        elif r < 0.19:
            parts.append(b"x")
            tags.add("extra")
        return Cmd(b" ".join(parts) + self.noreply(tags) + b"\r\n", tags)

    def touch(self):
        tags = {"cmd:touch"}
        parts = [b"touch", self.key(tags), self.r.choice(TIMES)]
        r = self.r.random()
        if r < 0.12:
            parts[2] = self.bad_number(tags, "exptime")
        elif r < 0.16:
            del parts[2]
            tags.add("missing")
        elif r < 0.19:
            parts.append(b"x")
            tags.add("extra")
        return Cmd(b" ".join(parts) + self.noreply(tags) + b"\r\n", tags)

    def admin(self):
        r = self.r.random()
        tags = set()
        if r < 0.2:
            tags.add("cmd:flush_all")
            arg = self.r.choice([b"", b" 0", b" 0", b" abc", b" -1x"])
            if arg in (b" abc", b" -1x"):
                tags.add("bad:delay")
            return Cmd(b"flush_all" + arg + self.noreply(tags) + b"\r\n", tags)
        if r < 0.3:
            return Cmd(b"version\r\n", {"cmd:version"})
        if r < 0.5:
            tags.add("cmd:verbosity")
            arg = self.r.choice([b" 0", b" 1", b" 0", b"", b" abc", b" -1", b" 0 0", b" 1 2 3"])
            if arg in (b"", b" abc", b" -1", b" 0 0", b" 1 2 3"):
                tags.add("verbosity:bad")
            return Cmd(b"verbosity" + arg + self.noreply(tags) + b"\r\n", tags)
        if r < 0.7:
            tags.add("cmd:stats")
            arg = self.r.choice([b"", b"", b" reset", b" bogus", b" settings", b" items",
                                 b" slabs", b" sizes", b" conns", b" detail", b" detail on",
                                 b" cachedump 1 1"])
            if arg not in (b"", b" reset", b" bogus", b" settings"):
                tags.add("stats:sub")
            if arg == b" reset":
                tags.add("stats:reset")
            if arg == b" cachedump 1 1":
                tags.add("stats:cachedump")
            return Cmd(b"stats" + arg + b"\r\n", tags)
        if r < 0.8:
            return Cmd(b"mn\r\n", {"cmd:mn"})
        if r < 0.9:
            tags.add("junk")
            return Cmd(self.r.choice([b"\r\n", b"bogus\r\n", b"GET\r\n", b"  get k0\r\n",
                                      b"get  k0  k1 \r\n", b"\tget k0\r\n", b"set\r\n",
                                      b"mg\r\n", b"ms k0\r\n", b"gets\r\n", b"cas k0\r\n",
                                      b"incr\r\n", b"md\r\n", b"ma\r\n", b"me\r\n",
                                      b"SET k0 0 0 1\r\nx\r\n",
                                      b"\x00\x01\x02\r\n", b"\xff\xfe\r\n"]), tags)
        if r < 0.92:
            return Cmd(b"get k0\r\r\n", {"junk", "key:ctrl"})  # the key is "k0\r"
        tags.add("junk")
        junk = bytes(self.r.choice(b"ab \x00\x01\x7f\xff0123\t") for _ in range(self.r.randrange(1, 30)))
        return Cmd(junk + b"\r\n", tags)

    # -- meta commands ----------------------------------------------------------------------
    META_FLAGS = {
        b"mg": [b"v", b"k", b"c", b"f", b"s", b"t", b"h", b"l", b"q", b"u", b"O123", b"Oabc",
                b"T100", b"N100", b"R30", b"E5", b"P", b"L"],
        b"ms": [b"k", b"c", b"q", b"O9", b"T100", b"T0", b"F5", b"F4294967295", b"I", b"MS",
                b"ME", b"MA", b"MP", b"MR", b"C" + CAS_LAST, b"C1", b"s", b"S1"],
        b"md": [b"k", b"q", b"O7", b"C" + CAS_LAST, b"C1", b"I", b"T100", b"x"],
        b"ma": [b"v", b"k", b"c", b"t", b"q", b"O5", b"N100", b"J13", b"D2", b"MI", b"MD",
                b"M+", b"M-", b"T100", b"C" + CAS_LAST, b"C1"],
    }
    BAD_META = [b"Tabc", b"N-", b"F-1", b"Fabc", b"Jx", b"D-1", b"Mx", b"MZ", b"C", b"Cabc",
                b"O" + b"o" * 40, b"!", b"9", b"\x01", b"vv", b"T", b"R", b"Q", b"w", b"Y"]
    # flags that 1.6.18 lacks and shoal takes on purpose (docs/protocol.md, Meta commands)
    EXTENSION_FLAGS = {b"mg": [b"E5"], b"md": [b"x"], b"ms": [b"S1"]}  # (1.6.18 takes s on ms)

    def meta(self):
        tags = set()
        verb = self.r.choice([b"mg", b"mg", b"mg", b"ms", b"ms", b"md", b"ma", b"me"])
        tags.add(f"cmd:{verb.decode()}")
        key = self.key(tags)
        if verb == b"me":
            return Cmd(b"me " + key + b"\r\n", tags)
        flags = []
        for f in self.META_FLAGS[verb]:
            if self.chance(0.18):
                flags.append(f)
        self.r.shuffle(flags)
        for f in flags:
            if f in self.EXTENSION_FLAGS.get(verb, []):
                tags.add("meta:extension")
        if self.chance(0.12):
            key = base64.b64encode(key)
            flags.insert(self.r.randrange(len(flags) + 1), b"b")
            tags.add("meta:b")
            if len(key) > 250:
                tags.add("key:long")  # 250 bytes take 336 in base64: too long as sent
            if b"k" in flags:
                tags.add("meta:bk")
            if verb in (b"mg", b"ma") and b"N100" in flags:
                tags.add("meta:bvivify")  # the item it may create has a binary key
        if self.chance(0.04):
            key = b"!!notb64"
            tags -= {"key:long", "key:ctrl", "key:high"}
            flags.insert(0, b"b")
            tags.add("meta:badb64")
        r = self.r.random()
        if r < 0.15:
            bad = self.r.choice(self.BAD_META)
            flags.insert(self.r.randrange(len(flags) + 1), bad)
            tags.add("meta:badflag")
            if bad.startswith(b"Oo"):
                tags.add("meta:longopaque")
        elif r < 0.19 and flags:
            flags.append(self.r.choice(flags))
            tags.add("meta:dupflag")
        elif r < 0.21:
            flags = [b"O%d" % i for i in range(20)] if verb != b"ms" else [b"T0", b"F0", b"I", b"c", b"k", b"q"] + [b"O%d" % i for i in range(14)]
            tags.add("meta:manyflags")
        sync = any(CAS_LAST in f for f in flags)
        if verb == b"ms":
            val = self.value()
            length = str(len(val)).encode()
            if self.chance(0.08):
                length = self.bad_number(tags, "length")
            elif self.chance(0.06):
                length = str(max(0, len(val) + self.r.choice([-1, 1, 3]))).encode()
                tags.add("bad:chunk")
            parts = [b"ms", key]
            if self.chance(0.03):
                tags.add("missing")  # no length at all
            else:
                parts.append(length)
            line = b" ".join(parts + flags)
            trailer = b"\r\n" if not self.chance(0.03) else b"X\r"
            block = val + trailer
            toks = [t for t in line.split(b" ") if t]
            n = mc_length(toks[2]) if len(toks) > 2 else None
            if len(val) >= 2048 and (n is None or n == "cas" or len(val) - n >= 2048):
                tags.add("line:long")  # (the rest of) the data block is read as a command line
            mc_data = None
            if "key:long" in tags and n is not None and n != "cas":
                # shoal (and current memcached) swallows an overlong key's data block; 1.6.18
                # runs it as commands, so it does not get it (filler up to <datalen> for shoal)
                tags.add("store:refused")
                block += b"x" * max(0, n + 2 - len(block))
                mc_data = line + b"\r\n" + block[n + 2:]
            return Cmd(line + b"\r\n" + block, tags, mc_data, sync=sync)
        if self.chance(0.03):
            tags.add("missing")
            return Cmd(verb + b"\r\n", tags)
        return Cmd(b" ".join([verb, key] + flags) + b"\r\n", tags, sync=sync)

    # -- sequences --------------------------------------------------------------------------
    def command(self):
        r = self.r.random()
        if r < 0.25:
            return self.text_store()
        if r < 0.40:
            return self.retrieval()
        if r < 0.46:
            return self.delete()
        if r < 0.53:
            return self.arith()
        if r < 0.57:
            return self.touch()
        if r < 0.67:
            return self.admin()
        return self.meta()

    def sequence(self):
        """1 to 10 commands; some split in two sends, some pipelined with the next ones.
        Returns a list of Cmd; the runner sends them in order, a Cmd with `split` in two
        pieces, and a `pipe` boundary is where a send ends."""
        n = self.r.choice([1, 2, 3, 4, 5, 6, 8, 10])
        cmds = [self.command() for _ in range(n)]
        if self.chance(0.02):
            cmds.append(Cmd(b"quit\r\n", {"cmd:quit"}))
        slipped = False
        for c in cmds:
            if slipped and len(c.data) >= 2048:
                # after a framing slip a long get line may be read from its middle: a non-get
                # line over 2 KiB, which memcached closes on
                c.tags.add("line:long")
            slipped = slipped or bool(c.tags & {"bad:chunk", "bad:length", "bad:trailer",
                                                 "store:malformed"})
        for c in cmds:
            if len(c.data) > 2 and self.chance(0.1):
                c.split = self.r.randrange(1, len(c.data))
        return cmds


def sequence(seed, index):
    """The index-th sequence of a run with this seed (independent of the other indexes)."""
    return Grammar((seed << 32) ^ index).sequence()
