/* repl_wire.h — the replication stream's framing between two shoal-nodes (docs/protocol.md,
 * "Replication"): the handshake lines and the binary frames, encoded and parsed here only, so
 * the primary's senders, the replica's applier and the fuzz target share one parser.
 *
 * A frame is a 16-byte header — type (1 byte), 3 zero bytes, payload length (u32 LE), offset
 * (u64 LE) — then the payload. Stream frames (the backlog's) carry in `offset` the primary's
 * stream offset at their end; snapshot and control frames carry what their type says. Nothing
 * here allocates: a parse looks at a caller's buffer and says how much it used. */
#ifndef SHOAL_NODE_REPL_WIRE_H
#define SHOAL_NODE_REPL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPL_HDR 16
#define REPL_PROTO_VERSION 1
/* The handshake word a primary opens its connection to the replica's data port with. */
#define REPL_HELLO "shoal_repl "
#define REPL_LINE_MAX 512   /* longest handshake line */
#define REPL_ITEM_FIXED 18  /* item payload before its key */
#define REPL_SLOT_BITMAP 2048 /* 16384 slots, one bit each */

enum repl_type {
    REPL_F_ITEM = 'S',     /* stream: an item as stored (every kind of store, md I, holds) */
    REPL_F_DEL = 'D',      /* stream: key deleted */
    REPL_F_TOUCH = 'T',    /* stream: key's TTL changed */
    REPL_F_FLUSH = 'F',    /* stream: flush_all [delay] */
    REPL_F_FLUSH_NS = 'N', /* stream: flush_ns <name> */
    REPL_F_SNAP = 's',     /* full sync: an item of the snapshot (same payload as 'S') */
    REPL_F_RESET = 'R',    /* full sync begins: drop the slots of the bitmap payload */
    REPL_F_SNAP_END = 'E', /* full sync done; offset: where the stream stands */
    REPL_F_PROGRESS = 'P', /* offset: stream bytes up to here are sent or not yours; payload:
                            * none, or REPL_WALL_LEN bytes: the primary's wall clock (u64 LE,
                            * Unix ms) before which every record it appended lies before offset */
    REPL_F_ACK = 'A',      /* replica to primary, no payload; offset: applied up to here */
};

struct repl_frame {
    uint8_t type;
    uint32_t len;
    uint64_t offset;
    const uint8_t *payload;
};

/* Is `t` a type counted in the stream offset (the backlog's frames)? */
static inline bool repl_type_stream(uint8_t t)
{
    return t == REPL_F_ITEM || t == REPL_F_DEL || t == REPL_F_TOUCH || t == REPL_F_FLUSH ||
           t == REPL_F_FLUSH_NS;
}

/* Parse one frame at buf[0..len). Returns the bytes it takes (header + payload), 0 when more
 * bytes are needed, or -1 with *why when it can never be a valid frame: an unknown type, a
 * nonzero reserved byte, or a payload longer than `max_payload` (the caller's buffer bound). */
long repl_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, struct repl_frame *f,
                      const char **why);
/* Write a header at dst (REPL_HDR bytes). */
void repl_frame_header(uint8_t *dst, uint8_t type, uint32_t len, uint64_t offset);

#define REPL_WALL_LEN 8
/* Write a stamped progress frame at dst (REPL_HDR + REPL_WALL_LEN bytes). */
void repl_progress_encode(uint8_t *dst, uint64_t offset, uint64_t wall_ms);
/* A progress frame's stamp: 1 with *wall_ms, 0 when unstamped, -1 (with *why) for a payload of
 * another length. */
int repl_progress_decode(const struct repl_frame *f, uint64_t *wall_ms, const char **why);

/* An item, key or TTL record's fields, decoded from (or to be encoded into) a payload. Pointers
 * point into the payload. ttl: seconds left, 0 = never expires. */
struct repl_rec {
    const char *key;
    uint8_t nkey;
    uint8_t iflags;
    uint32_t flags;
    uint32_t ttl;
    uint64_t cas;
    const char *value;
    uint32_t nbytes;
};
/* Decode the payload of a frame of type 'S'/'s' (item), 'D' (key), 'T' (key, ttl), 'F' (ttl =
 * delay), 'N' (key = namespace name). 0, or -1 with *why when the payload is malformed. */
int repl_rec_decode(const struct repl_frame *f, struct repl_rec *r, const char **why);
/* Payload bytes of an item record. */
static inline size_t repl_item_payload(size_t nkey, size_t nbytes)
{
    return REPL_ITEM_FIXED + nkey + nbytes;
}
/* Encode an item record's fixed part and key at dst (the value follows at
 * dst + REPL_ITEM_FIXED + nkey, written by the caller). */
void repl_item_encode(uint8_t *dst, const struct repl_rec *r);

/* Handshake lines (each ends in \r\n; `line` excludes it):
 *   primary: "shoal_repl 1 <primary host:port> <replid>"
 *   replica: "REPL HAVE <replid or -> <applied>" | "REPL REFUSED <reason>"
 *   primary: "REPL CONTINUE <offset>" | "REPL FULL <offset>"
 * A replid is 16 lowercase hex digits. Parsers return 0, or -1 for a malformed line. */
int repl_hello_parse(const char *line, size_t len, char *primary, size_t primarycap,
                     char replid[17]);
int repl_have_parse(const char *line, size_t len, char replid[17], uint64_t *applied,
                    bool *refused);
int repl_start_parse(const char *line, size_t len, bool *full, uint64_t *offset);

#endif
