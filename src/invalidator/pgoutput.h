/* pgoutput.h — decoding PostgreSQL's logical replication stream: the replication protocol's
 * CopyData frames (XLogData 'w', primary keepalive 'k'), the standby status update we send back,
 * and the pgoutput plugin's messages inside XLogData (protocol version 2, streaming on).
 *
 * Pure code: no libpq, no allocation. Every decoded string and value points into the caller's
 * message bytes, which must outlive the decoded form. Any length or count that would read past
 * the end of the message makes the decode fail; nothing is trusted. */
#ifndef SHOAL_INVALIDATOR_PGOUTPUT_H
#define SHOAL_INVALIDATOR_PGOUTPUT_H

#include <stddef.h>
#include <stdint.h>

/* PostgreSQL's limit on a tuple's columns (MaxTupleAttributeNumber) */
#define PGO_MAX_COLS 1664

/* Microseconds from the unix epoch to PostgreSQL's (2000-01-01). */
#define PGO_EPOCH_OFFSET_US 946684800000000LL

/* A replication protocol frame from the server. */
struct pgo_frame {
    char kind;           /* 'w' XLogData, 'k' keepalive */
    uint64_t wal_start;  /* 'w': where this message's WAL starts */
    uint64_t wal_end;    /* the server's WAL end */
    int64_t send_time;   /* server clock, PostgreSQL-epoch microseconds */
    int reply_requested; /* 'k': answer now or be disconnected */
    const uint8_t *data; /* 'w': the pgoutput message */
    size_t ndata;
};

/* 0, or -1 when the frame is short or of an unknown kind. */
int pgo_frame_decode(const uint8_t *p, size_t n, struct pgo_frame *f);

/* Writes a standby status update ('r', 34 bytes) into out; returns its length. */
size_t pgo_status_update(uint8_t out[34], uint64_t written, uint64_t flushed, uint64_t applied,
                         int64_t now_pg_us, int reply);

/* One column value of a TupleData. */
struct pgo_value {
    char kind;        /* 'n' null, 'u' unchanged TOASTed value (not sent), 't' text, 'b' binary */
    const char *data; /* 't'/'b' */
    uint32_t len;
};

struct pgo_tuple {
    uint16_t ncols;
    struct pgo_value vals[PGO_MAX_COLS];
};

struct pgo_column {
    uint8_t flags; /* 1: part of the replica identity */
    const char *name;
    uint32_t type_oid;
    int32_t typmod;
};

enum pgo_kind {
    PGO_BEGIN = 'B',
    PGO_COMMIT = 'C',
    PGO_ORIGIN = 'O',
    PGO_RELATION = 'R',
    PGO_TYPE = 'Y',
    PGO_INSERT = 'I',
    PGO_UPDATE = 'U',
    PGO_DELETE = 'D',
    PGO_TRUNCATE = 'T',
    PGO_MESSAGE = 'M',
    PGO_STREAM_START = 'S',
    PGO_STREAM_STOP = 'E',
    PGO_STREAM_COMMIT = 'c',
    PGO_STREAM_ABORT = 'A',
};

/* A decoded pgoutput message. Large (two tuples and a relation's columns): allocate it once. */
struct pgo_msg {
    char kind;
    uint32_t xid;        /* B; S, c, A; and changes inside a stream block */
    uint32_t subxid;     /* A: the aborted (sub)transaction; equal to xid for the whole one */
    uint64_t lsn;        /* B: final LSN; C/c: commit LSN; O, M: their LSN */
    uint64_t end_lsn;    /* C/c: the transaction's end LSN */
    int64_t ts;          /* B, C, c: commit time, PostgreSQL-epoch microseconds */
    uint8_t flags;       /* C/c flags; S: 1 on a transaction's first block; T: options; M */
    /* R, Y, I, U, D */
    uint32_t relid;
    const char *nspname; /* R, Y ("" for pg_catalog); O: origin name; M: prefix */
    const char *relname; /* R, Y */
    char replident;      /* R: 'd' default, 'n' nothing, 'f' full, 'i' index */
    uint16_t ncols;      /* R */
    struct pgo_column cols[PGO_MAX_COLS];
    /* U, D: 'K' (identity columns only) or 'O' (whole old row); 0 when absent (U only) */
    char old_kind;
    struct pgo_tuple old;
    struct pgo_tuple new; /* I, U */
    /* M: the message's content (not NUL-terminated) */
    const uint8_t *content;
    uint32_t ncontent;
    /* T */
    uint32_t nrels;
    const uint8_t *relids; /* nrels big-endian int32 relids: pgo_truncate_relid() */
};

/* Decode one pgoutput message. `in_stream` is nonzero between Stream Start and Stream Stop:
 * there, change, relation and type messages carry a transaction id first. 0, or -1 on a
 * malformed or unknown message (a message the decoder does not know is an error: skipping it
 * could skip a change). */
int pgo_decode(const uint8_t *p, size_t n, int in_stream, struct pgo_msg *m);

/* The i-th relid of a decoded truncate. */
uint32_t pgo_truncate_relid(const struct pgo_msg *m, uint32_t i);

/* Text form of an LSN ("16/B374D848") into out (at least 20 bytes). */
void pgo_lsn_format(uint64_t lsn, char *out, size_t cap);
/* Parse "X/Y"; 0, or -1. */
int pgo_lsn_parse(const char *s, uint64_t *lsn);

#endif
