/* test_router_replyframe.c — unit tests for the check of a node's reply against the request it
 * is matched to (reply_fits, and the router's form of it, reply_fits_want on what reply_want_of
 * kept of the line): a table of request lines and replies that must fit and that must not,
 * among them every kind of request the router composes itself (probes, warm lookups and fills,
 * repairs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "protocol/protocol.h"
#include "router/replyframe.h"

struct pair {
    const char *req;   /* as sent, with its \r\n and any data block */
    const char *reply; /* one whole reply */
};

/* The router's own check (reply_fits_want on the line's want) agrees with reply_fits for a
 * request line that parses, as every line the router sends does. */
static void check_want(const char *req, size_t nreq, const char *reply, size_t nreply, bool fit)
{
    struct proto_req rq;
    const char *err, *nl = memchr(req, '\n', nreq);
    if (proto_parse(req, nl ? (size_t)(nl - req) : nreq, SIZE_MAX, &rq, &err) != PROTO_OK) return;
    struct reply_want w;
    reply_want_of(&w, req, nreq);
    if (reply_fits_want(&w, req, reply, nreply) != fit) {
        print_error("request %s reply %s: reply_fits_want says %d\n", req, reply, (int)!fit);
        fail();
    }
}

/* Each reply of `pairs` must (fit) or must not fit its request, whichever way it arrives: the
 * request with or without its data, the reply framed as reply_length frames it. */
static void check(const struct pair *pairs, size_t n, bool fit)
{
    for (size_t i = 0; i < n; i++) {
        const struct pair *p = &pairs[i];
        size_t nreply = strlen(p->reply), scan = 0;
        long framed = reply_length(p->reply, nreply, 1 << 20, 1 << 30, &scan);
        bool got = reply_fits(p->req, strlen(p->req), p->reply, nreply);
        if (got != fit || (fit && framed != (long)nreply)) {
            print_error("request %s reply %s: fits %d, framed %ld of %zu\n", p->req, p->reply,
                        (int)got, framed, nreply);
            fail();
        }
        const char *nl = strchr(p->req, '\n');
        assert_int_equal(reply_fits(p->req, (size_t)(nl - p->req) + 1, p->reply, nreply), fit);
        check_want(p->req, strlen(p->req), p->reply, nreply, fit);
        check_want(p->req, (size_t)(nl - p->req) + 1, p->reply, nreply, fit);
    }
}

static const struct pair text_good[] = {
    {"get a\r\n", "END\r\n"},
    {"get a\r\n", "VALUE a 0 3\r\nabc\r\nEND\r\n"},
    {"get a b c\r\n", "VALUE a 0 1\r\nx\r\nVALUE c 5 0\r\n\r\nEND\r\n"}, /* b missed */
    {"get a b c\r\n", "VALUE c 0 1\r\nx\r\nEND\r\n"},
    {"get a a\r\n", "VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"}, /* asked twice */
    {"get a b\r\n", "VALUE a 0 5\r\nEND\r\n\r\nEND\r\n"}, /* a value that looks like END */
    {"gets a b\r\n", "VALUE b 0 1 12345678901234\r\nx\r\nEND\r\n"},
    {"gat 60 a b\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},
    {"gats 60 a\r\n", "VALUE a 0 1 7\r\nx\r\nEND\r\n"},
    {"get a\r\n", "SERVER_ERROR out of memory writing get response\r\n"},
    {"get a b\r\n", "VALUE a 0 1\r\nx\r\nSERVER_ERROR out of memory\r\n"},
    {"set a 0 0 3\r\nabc\r\n", "STORED\r\n"},
    {"add a 0 0 3\r\nabc\r\n", "NOT_STORED\r\n"},
    {"cas a 0 0 3 9\r\nabc\r\n", "EXISTS\r\n"},
    {"cas a 0 0 3 9\r\nabc\r\n", "NOT_FOUND\r\n"},
    {"append a 0 0 1\r\nx\r\n", "STORED\r\n"},
    {"set a 0 0 1\r\nx\r\n", "SERVER_ERROR out of memory storing object\r\n"},
    {"set a 0 0 1\r\nx\r\n", "CLIENT_ERROR bad data chunk\r\n"},
    {"delete a\r\n", "DELETED\r\n"},
    {"delete a 2\r\n", "NOT_FOUND\r\n"},
    {"incr a 5\r\n", "18446744073709551615\r\n"},
    {"decr a 5\r\n", "0\r\n"},
    {"incr a 5\r\n", "NOT_FOUND\r\n"},
    {"incr a 5\r\n", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"},
    {"touch a 10\r\n", "TOUCHED\r\n"},
    {"touch a 10\r\n", "NOT_FOUND\r\n"},
    {"version\r\n", "VERSION 1.6.21\r\n"},   /* the router's probe */
    {"flush_all\r\n", "OK\r\n"},             /* and its repair of a node that missed one */
    {"flush_all 10\r\n", "OK\r\n"},
    {"frobnicate\r\n", "ERROR\r\n"},
};

static const struct pair text_bad[] = {
    {"get bob:x\r\n", "STORED\r\n"},
    {"get bob:x\r\n", "VALUE alice:token 0 3\r\nabc\r\nEND\r\n"}, /* another request's value */
    {"get a b\r\n", "VALUE b 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"}, /* out of order */
    {"get a\r\n", "VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"},     /* once asked */
    {"get ab\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},                        /* a prefix */
    {"get a\r\n", "VALUE ab 0 1\r\nx\r\nEND\r\n"},
    {"get a\r\n", "VALUE a 0 1 5\r\nx\r\nEND\r\n"},  /* a gets reply */
    {"gets a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},   /* a get reply */
    {"get a\r\n", "VALUE a 0 1\r\nx\r\nSTORED\r\n"},
    {"get a\r\n", "VALUE a 0 1\r\nx\r\n"},           /* no END */
    {"get a\r\n", "END\n"},                          /* not \r\n */
    {"get a\r\n", "EN\r\n"},
    {"get a\r\n", "VA 1\r\nx\r\n"},
    {"get a\r\n", "END\r\nEND\r\n"},                 /* two replies given as one */
    {"set a 0 0 1\r\nx\r\n", "END\r\n"},
    {"set a 0 0 1\r\nx\r\n", "DELETED\r\n"},
    {"set a 0 0 1\r\nx\r\n", "STORED \r\n"},
    {"set a 0 0 1\r\nx\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},
    {"delete a\r\n", "STORED\r\n"},
    {"delete a\r\n", "HD\r\n"},
    {"incr a 1\r\n", "STORED\r\n"},
    {"incr a 1\r\n", "12a\r\n"},
    {"incr a 1\r\n", "123456789012345678901\r\n"},   /* 21 digits */
    {"incr a 1\r\n", "\r\n"},
    {"touch a 1\r\n", "DELETED\r\n"},
    {"version\r\n", "END\r\n"},
    {"version\r\n", "VERSIONS\r\n"},
    {"flush_all\r\n", "STORED\r\n"},
    {"flush_all\r\n", "RESET\r\n"},                    /* stats reset's answer only */
    {"frobnicate\r\n", "OK\r\n"},                    /* does not parse: only an error fits */
    {"get a\r\n", "ERRORS\r\n"},
    {"get a\r\n", "SERVER_ERRORx\r\n"},
    {"get a\r\n", "SERVER_ERROR x\r\nEND\r\n"},
};

static const struct pair text_cr_keys[] = {
    {"get c\rr\r\n", "VALUE c\rr 0 1\r\nx\r\nEND\r\n"},
    {"gets c\r\r\n", "VALUE c\r 0 1 5\r\nx\r\nEND\r\n"}, /* one \r ends the line */
};

static const struct pair meta_good[] = {
    {"mg a v\r\n", "VA 3\r\nabc\r\n"},
    {"mg a v\r\n", "EN\r\n"},
    {"mg a\r\n", "HD\r\n"},
    {"mg a s t\r\n", "HD s3 t-1\r\n"},
    {"mg a v k O123\r\n", "VA 1 ka O123\r\nx\r\n"},
    {"mg a k O123\r\n", "EN ka O123\r\n"},             /* echoed on a miss too */
    {"mg a O1 k\r\n", "HD O1 ka\r\n"},
    {"mg a O1 O2\r\n", "CLIENT_ERROR duplicate flag\r\n"},
    {"mg YWJj b k v\r\n", "VA 1 kYWJj b\r\nx\r\n"},    /* base64: "abc" */
    {"mg YWJj b k v\r\n", "VA 1 kabc\r\nx\r\n"},      /* a hit on a key stored plain */
    {"mg abc k\r\n", "HD kYWJj b\r\n"},               /* a hit on a key stored under b */
    {"mg c\rr k v\r\n", "VA 1 kc\rr\r\nx\r\n"},     /* a \r is a key byte */
    /* a token that ends in a \r of its own keeps it when echoed last on the line */
    {"mg v3 O1\r v\r\n", "EN O1\r\r\n"},
    {"mg v3 O1\r\r\n", "EN O1\r\r\n"},            /* one \r ends the line, one is the O's */
    {"mg v3\r k v\r\n", "EN kv3\r\r\n"},
    {"mg a\r O1 k\r\n", "EN O1 ka\r\r\n"},
    {"ms v3\r 1 k O5\r\nx\r\n", "HD kv3\r O5\r\n"},
    {"mg a v f t c k\r\n", "VA 2 f0 t-1 c9 ka\r\nhi\r\n"}, /* a warm lookup */
    {"mg a v f t c k\r\n", "EN ka\r\n"},
    {"mg a v c N30\r\n", "VA 0 c7 W\r\n\r\n"},         /* a vivified placeholder */
    {"mg a v\r\n", "CLIENT_ERROR bad command line format\r\n"},
    {"ms a 2 F0 T60 ME E9\r\nhi\r\n", "HD\r\n"},       /* a warm fill */
    {"ms a 2 F0 T60 ME E9\r\nhi\r\n", "NS\r\n"},
    {"ms a 2 F0 T60 C5 E9\r\nhi\r\n", "EX\r\n"},
    {"ms a 2 C5\r\nhi\r\n", "NF\r\n"},
    {"ms a 2 k O9\r\nhi\r\n", "HD ka O9\r\n"},
    {"ms YWJj 2 b k\r\nhi\r\n", "HD kYWJj b\r\n"},
    {"md a\r\n", "HD\r\n"},                            /* a repair */
    {"md YWJj b\r\n", "NF\r\n"},                       /* a repair of a key not text-safe */
    {"md a C5\r\n", "EX\r\n"},
    {"md a q O1\r\n", "HD O1\r\n"},
    {"ma a\r\n", "HD\r\n"},
    {"ma a v\r\n", "VA 2\r\n12\r\n"},
    {"ma a\r\n", "NF\r\n"},
    {"ma a N0\r\n", "NS\r\n"},
    {"ma a C1\r\n", "EX\r\n"},
    {"ma a v k\r\n", "VA 1 ka\r\n3\r\n"},
    {"mn\r\n", "MN\r\n"},
    {"me a\r\n", "ME a exp=-1 la=0 cas=1 fetch=no cls=1 size=70\r\n"},
    {"me a\r\n", "EN\r\n"},
};

static const struct pair meta_bad[] = {
    {"mg a v\r\n", "STORED\r\n"},
    {"mg a v\r\n", "END\r\n"},
    {"mg a v\r\n", "NF\r\n"},
    {"mg a v\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},
    {"mg a v\r\n", "VA 1\r\nx\r\nHD\r\n"},             /* two replies given as one */
    {"mg a v\r\n", "ENX\r\n"},
    {"mg a\r\n", "HD\r\nHD\r\n"},
    {"mg a v k\r\n", "VA 1 kb\r\nx\r\n"},              /* another key's value */
    {"mg a v k\r\n", "VA 1\r\nx\r\n"},                 /* k asked, none given */
    {"mg a k\r\n", "EN kab\r\n"},
    {"mg a O1\r\n", "HD O2\r\n"},
    {"mg a O1\r\n", "EN\r\n"},
    {"mg a O1 O2\r\n", "HD O1 O2\r\n"},               /* cannot parse: only an error fits */
    {"mg a O12\r\n", "HD O1\r\n"},
    {"mg a v f t c k\r\n", "EN kb\r\n"},               /* a warm lookup answered for b */
    {"mg YWJj b k\r\n", "HD kYWJk b\r\n"},             /* base64 of another key */
    {"mg YWJj b k\r\n", "HD k!!!! b\r\n"},             /* not base64 */
    {"mg YWJj b k\r\n", "HD kabd\r\n"},               /* another key, plain */
    {"mg abc k\r\n", "HD kYWJk b\r\n"},               /* another key, base64 */
    {"mg c\rr k\r\n", "HD kc\r\n"},
    {"mg v3 O1\r v\r\n", "EN O1\r\n"},              /* the O's \r is part of it */
    {"mg v3 O1 v\r\n", "EN O1\r\r\n"},
    {"mg v3 k v\r\n", "EN kv3\r\r\n"},
    {"ms a 2\r\nhi\r\n", "VA 1\r\nx\r\n"},
    {"ms a 2\r\nhi\r\n", "EN\r\n"},
    {"ms a 2\r\nhi\r\n", "STORED\r\n"},
    {"ms a 2 k\r\nhi\r\n", "HD kb\r\n"},
    {"md a\r\n", "NS\r\n"},
    {"md a\r\n", "DELETED\r\n"},
    {"md a O7\r\n", "HD O8\r\n"},
    {"ma a\r\n", "EN\r\n"},
    {"ma a v\r\n", "VA 2\r\n1\r\n"},                   /* the value is not the length said */
    {"mn\r\n", "HD\r\n"},
    {"me a\r\n", "HD\r\n"},
    {"version\r\n", "MN\r\n"},
};

#define COUNT(a) (sizeof(a) / sizeof *(a))

static void test_text_replies_that_fit(void **state) { check(text_good, COUNT(text_good), true); }
static void test_text_replies_that_do_not(void **state) { check(text_bad, COUNT(text_bad), false); }
static void test_keys_with_control_bytes(void **state)
{
    check(text_cr_keys, COUNT(text_cr_keys), true);
}
static void test_meta_replies_that_fit(void **state) { check(meta_good, COUNT(meta_good), true); }
static void test_meta_replies_that_do_not(void **state) { check(meta_bad, COUNT(meta_bad), false); }

/* Every prefix of a fitting reply falls short: nothing is accepted before it is whole. */
static void check_prefixes(const struct pair *pairs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < strlen(pairs[i].reply); k++) {
            assert_false(reply_fits(pairs[i].req, strlen(pairs[i].req), pairs[i].reply, k));
            check_want(pairs[i].req, strlen(pairs[i].req), pairs[i].reply, k, false);
        }
}

static void test_a_partial_reply_never_fits(void **state)
{
    check_prefixes(text_good, COUNT(text_good));
    check_prefixes(meta_good, COUNT(meta_good));
}

/* A reply of the request's kind that echoes another key or opaque is told apart from one of
 * another kind (upstream.c fails the first alone and checks the connection with an mn). */
static void test_an_echo_mismatch_is_told_from_a_wrong_kind(void **state)
{
    static const struct {
        const char *req, *reply;
        enum reply_fit fit;
    } cases[] = {
        {"mg a O1\r\n", "HD O1\r\n", RFIT_OK},
        {"mg a O1\r\n", "HD O2\r\n", RFIT_ECHO},
        {"mg a O1\r\n", "EN\r\n", RFIT_ECHO},
        {"mg a k v\r\n", "VA 1 kb\r\nx\r\n", RFIT_ECHO},
        {"ms a 2 k\r\nhi\r\n", "HD kb\r\n", RFIT_ECHO},
        {"get a\r\n", "VALUE b 0 1\r\nx\r\nEND\r\n", RFIT_ECHO},
        {"get a b\r\n", "VALUE b 0 1\r\nx\r\nVALUE a 0 1\r\ny\r\nEND\r\n", RFIT_ECHO},
        {"get a b\r\n", "VALUE a 0 1\r\nx\r\nVALUE b 0 1\r\ny\r\nEND\r\n", RFIT_OK},
        {"mg a O1\r\n", "STORED\r\n", RFIT_BAD},
        {"mg a O1\r\n", "VA 2 O1\r\nx\r\n", RFIT_BAD},
        {"get a\r\n", "STORED\r\n", RFIT_BAD},
        {"get a\r\n", "VALUE b 0 1\r\nx\r\nSTORED\r\n", RFIT_BAD},
        {"get a\r\n", "VALUE a 0 1 5\r\nx\r\nEND\r\n", RFIT_BAD}, /* a gets' line */
        {"set a 0 0 1\r\nx\r\n", "HD\r\n", RFIT_BAD},
        {"mg a\r\n", "MN\r\n", RFIT_BAD},
    };
    for (size_t i = 0; i < COUNT(cases); i++) {
        struct reply_want w;
        reply_want_of(&w, cases[i].req, strlen(cases[i].req));
        enum reply_fit got = reply_check_want(&w, cases[i].req, cases[i].reply,
                                              strlen(cases[i].reply));
        if (got != cases[i].fit) {
            print_error("request %s reply %s: %d, not %d\n", cases[i].req, cases[i].reply,
                        (int)got, (int)cases[i].fit);
            fail();
        }
    }
}

/* The slice [off, end) of line, as a string to compare. */
static const char *slice(const char *line, uint32_t off, uint32_t end)
{
    static char out[512];
    snprintf(out, sizeof out, "%.*s", (int)(end - off), line + off);
    return out;
}

/* What reply_want_of keeps of a line: its command, where its keys (or meta key) and O token
 * stand, the k and b flags, and the value slots; tokens split on runs of spaces. */
static void test_want_of_a_line(void **state)
{
    struct reply_want w;
    const char *l = "gat 30  a bb  c\r\n";
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_GAT);
    assert_int_equal(w.slots, 3);
    assert_string_equal(slice(l, w.key, w.key_end), "a bb  c");

    l = "  gets a\r\n";
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_GETS);
    assert_int_equal(w.slots, 1);
    assert_string_equal(slice(l, w.key, w.key_end), "a");

    l = "mg  key1  v O12 k  O9 t\r\n";
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_MG);
    assert_string_equal(slice(l, w.key, w.key_end), "key1");
    assert_true(w.has_opaque && w.echo_key && !w.base64);
    assert_string_equal(slice(l, w.opaque, w.opaque + w.nopaque), "12"); /* the first O */

    l = "ms YWJj 2 T0 b O k\r\nhi\r\n"; /* an empty opaque still has to be echoed */
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_MS);
    assert_string_equal(slice(l, w.key, w.key_end), "YWJj");
    assert_true(w.has_opaque && w.nopaque == 0 && w.echo_key && w.base64);

    l = "md a q\r\n";
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_MD);
    assert_false(w.has_opaque || w.echo_key || w.base64);

    l = "ms k 5 O1\r\n"; /* a key that looks like a flag is none */
    reply_want_of(&w, l, strlen(l));
    assert_int_equal(w.cmd, CMD_MS);
    assert_string_equal(slice(l, w.key, w.key_end), "k");
    assert_true(w.has_opaque && !w.echo_key);

    /* no command, or one never forwarded: only an error line answers it (an lru_crawler line
     * keeps its command, as the parser gives it, with no list unless it is a metadump) */
    const char *none[] = {"lru_crawler crawl all\r\n", " lru_crawler\r\n", "bogus a\r\n",
                          "mg\r\n", "", "GET a\r\n",
                          "mg a O0123456789012345678901234567890123\r\n"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        reply_want_of(&w, none[i], strlen(none[i]));
        assert_int_equal(w.cmd, strstr(none[i], "lru_crawler") ? CMD_LRU_CRAWLER : CMD_NONE);
        assert_int_equal(w.list, RLIST_NONE);
        assert_int_equal(w.slots, 1);
        assert_false(reply_fits_want(&w, none[i], "OK\r\n", 4));
        assert_false(reply_fits_want(&w, none[i], "END\r\n", 5));
        assert_true(reply_fits_want(&w, none[i], "ERROR\r\n", 7));
    }
}

/* Lists (stats and dumps): their lines then END, or one line that is the whole reply. */
static const struct pair list_good[] = {
    {"stats\r\n", "STAT pid 1\r\nSTAT version 1.6.18\r\nEND\r\n"},
    {"stats\r\n", "END\r\n"},
    {"stats items\r\n", "STAT items:1:number 3\r\nEND\r\n"},
    {"stats slabs\r\n", "STAT 1:chunk_size 96\r\nSTAT active_slabs 1\r\nEND\r\n"},
    {"stats sizes\r\n", "STAT sizes_status disabled\r\nEND\r\n"},
    {"stats settings\r\n", "STAT maxbytes 67108864\r\nEND\r\n"},
    {"stats items\r\n", "SERVER_ERROR out of memory\r\n"},
    {"stats cachedump 1 10\r\n", "ITEM a [1 b; 0 s]\r\nITEM b [3 b; 0 s]\r\nEND\r\n"},
    {"stats cachedump 1 10\r\n", "CLIENT_ERROR bad command line format\r\n"},
    {"stats detail dump\r\n", "PREFIX a get 1 hit 1 set 1 del 0\r\nEND\r\n"},
    {"stats detail on\r\n", "OK\r\n"},
    {"stats reset\r\n", "RESET\r\n"},                    /* sent to every node */
    {"lru_crawler metadump all\r\n", "key=a exp=-1 la=1 cas=2 fetch=no cls=1 size=63\n"
                                       "key=b%3A1 exp=-1 la=1 cas=3 fetch=yes cls=1 size=64\n"
                                       "END\r\n"},
    {"lru_crawler metadump hash\r\n", "key=a exp=-1\r\nEND\r\n"},
    {"lru_crawler metadump all\r\n", "END\r\n"},
    {"lru_crawler metadump 99\r\n", "BADCLASS invalid class id\r\n"},
    {"lru_crawler metadump all\r\n", "BUSY currently processing crawler request\r\n"},
    {"lru_crawler metadump all\r\n", "ERROR\r\n"},
};

static const struct pair list_bad[] = {
    {"stats\r\n", "STAT pid 1\r\n"},                         /* no END */
    {"stats\r\n", "STAT pid 1\nEND\r\n"},                     /* a bare \n */
    {"stats\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"},             /* another kind */
    {"stats\r\n", "STAT pid 1\r\nERROR\r\n"},                /* an error after lines */
    {"stats\r\n", "END\r\nEND\r\n"},                         /* a stray END */
    {"stats\r\n", "OK\r\n"},
    {"stats items\r\n", "ITEM a [1 b; 0 s]\r\nEND\r\n"},
    {"stats cachedump 1 1\r\n", "STAT a 1\r\nEND\r\n"},
    {"stats cachedump 1 1\r\n", "key=a exp=-1\nEND\r\n"},
    {"stats detail dump\r\n", "STAT a 1\r\nEND\r\n"},
    {"stats detail on\r\n", "END\r\n"},
    {"lru_crawler metadump all\r\n", "STAT a 1\r\nEND\r\n"},
    {"lru_crawler metadump all\r\n", "key=a\nBUSY currently processing crawler request\r\n"},
    {"lru_crawler metadump all\r\n", "STORED\r\n"},
    {"lru_crawler crawl all\r\n", "OK\r\n"},                 /* the router never sends it */
};

/* A list's lines one at a time, as the router takes them (reply_list_line): whole lines, the
 * last one END or the reply's only line. Returns the bytes framed, -1 when refused. */
static long walk_list(const char *req, const char *reply, size_t n)
{
    struct reply_want w;
    reply_want_of(&w, req, strlen(req));
    size_t pos = 0, ll;
    for (bool first = true;; first = false) {
        switch (reply_list_line(&w, reply + pos, n - pos, first, &ll)) {
        case RLL_ITEM: pos += ll; break;
        case RLL_END: case RLL_ONE: return (long)(pos + ll);
        case RLL_MORE: return 0;
        default: return -1;
        }
    }
}

static void check_list(const struct pair *pairs, size_t n, bool fit)
{
    for (size_t i = 0; i < n; i++) {
        const struct pair *p = &pairs[i];
        size_t nreply = strlen(p->reply);
        bool got = reply_fits(p->req, strlen(p->req), p->reply, nreply);
        if (got != fit) {
            print_error("request %s reply %s: fits %d\n", p->req, p->reply, (int)got);
            fail();
        }
        struct reply_want w;
        reply_want_of(&w, p->req, strlen(p->req));
        assert_int_equal(reply_fits_want(&w, p->req, p->reply, nreply), fit);
        if (!fit || w.list == RLIST_NONE) continue;
        assert_int_equal(walk_list(p->req, p->reply, nreply), (long)nreply);
        for (size_t k = 0; k < nreply; k++) { /* a part is never the whole */
            assert_false(reply_fits(p->req, strlen(p->req), p->reply, k));
            assert_true(walk_list(p->req, p->reply, k) <= 0);
        }
    }
}

static void test_list_replies_that_fit(void **state) { check_list(list_good, COUNT(list_good), true); }
static void test_list_replies_that_do_not(void **state)
{
    check_list(list_bad, COUNT(list_bad), false);
}

/* A list line longer than REPLY_LINE_MAX is refused before it is all there. */
static void test_a_list_line_is_bounded(void **state)
{
    static char big[REPLY_LINE_MAX + 16];
    memcpy(big, "key=", 4);
    memset(big + 4, 'a', sizeof big - 4);
    struct reply_want w;
    const char *req = "lru_crawler metadump all\r\n";
    reply_want_of(&w, req, strlen(req));
    assert_int_equal(w.list, RLIST_KEY);
    size_t ll;
    assert_int_equal(reply_list_line(&w, big, REPLY_LINE_MAX - 1, true, &ll), RLL_MORE);
    assert_int_equal(reply_list_line(&w, big, sizeof big, true, &ll), RLL_BAD);
}

/* The want holds offsets, not pointers: it checks the reply against the same line at another
 * address (the router moves a sent line to a smaller buffer), and a key echoed under b is
 * compared decoded. */
static void test_want_follows_its_line(void **state)
{
    char a[64], b[64];
    strcpy(a, "mg YWJj b k O5 v\r\n");
    struct reply_want w;
    reply_want_of(&w, a, strlen(a));
    memcpy(b, a, sizeof a);
    memset(a, 'x', sizeof a);
    static const char *const fit[] = {"VA 1 kYWJj O5 b\r\nx\r\n", "EN O5 kYWJj b\r\n"};
    static const char *const unfit[] = {"EN O5 kYWJk b\r\n", "EN O6 kYWJj b\r\n",
                                        "EN kYWJj b\r\n", "EN O5\r\n"};
    for (size_t i = 0; i < sizeof fit / sizeof *fit; i++)
        assert_true(reply_fits_want(&w, b, fit[i], strlen(fit[i])));
    for (size_t i = 0; i < sizeof unfit / sizeof *unfit; i++)
        assert_false(reply_fits_want(&w, b, unfit[i], strlen(unfit[i])));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_replies_that_fit),
        cmocka_unit_test(test_text_replies_that_do_not),
        cmocka_unit_test(test_keys_with_control_bytes),
        cmocka_unit_test(test_meta_replies_that_fit),
        cmocka_unit_test(test_meta_replies_that_do_not),
        cmocka_unit_test(test_a_partial_reply_never_fits),
        cmocka_unit_test(test_an_echo_mismatch_is_told_from_a_wrong_kind),
        cmocka_unit_test(test_want_of_a_line),
        cmocka_unit_test(test_want_follows_its_line),
        cmocka_unit_test(test_list_replies_that_fit),
        cmocka_unit_test(test_list_replies_that_do_not),
        cmocka_unit_test(test_a_list_line_is_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
