/* topodoc.c — a version's topology document, shared by its answers (see topodoc.h). */
#include "control/topodoc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/admin.h"

struct topo_doc {
    unsigned refs; /* atomic */
    uint64_t version;
    char *text;
    size_t len;
    pthread_mutex_t gz_mu; /* the first gzip answer compresses; the others wait for it */
    bool gz_tried;
    unsigned char *gz; /* NULL: not made, or compression failed (answers go plain) */
    size_t gzlen;
};

struct topo_doc *topo_doc_new(char *text, size_t len, uint64_t version)
{
    struct topo_doc *d = calloc(1, sizeof *d);
    if (d == NULL) {
        free(text);
        return NULL;
    }
    d->refs = 1;
    d->version = version;
    d->text = text;
    d->len = len;
    pthread_mutex_init(&d->gz_mu, NULL);
    return d;
}

struct topo_doc *topo_doc_ref(struct topo_doc *d)
{
    if (d) __atomic_fetch_add(&d->refs, 1, __ATOMIC_RELAXED);
    return d;
}

void topo_doc_unref(struct topo_doc *d)
{
    if (d == NULL || __atomic_sub_fetch(&d->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    pthread_mutex_destroy(&d->gz_mu);
    free(d->text);
    free(d->gz);
    free(d);
}

const char *topo_doc_text(const struct topo_doc *d, size_t *len)
{
    *len = d->len;
    return d->text;
}

uint64_t topo_doc_version(const struct topo_doc *d) { return d->version; }

bool topo_doc_gzip_accepted(const char *ae)
{
    /* "gzip", "gzip, deflate", "deflate, gzip;q=1.0"; "gzip;q=0" refuses it */
    for (const char *p = ae ? strstr(ae, "gzip") : NULL; p; p = strstr(p + 4, "gzip")) {
        if (p != ae && p[-1] != ' ' && p[-1] != ',') continue;
        const char *q = p + 4;
        while (*q == ' ') q++;
        if (*q == 0 || *q == ',') return true;
        if (*q == ';') {
            const char *v = strstr(q, "q=");
            return v == NULL || strtod(v + 2, NULL) > 0;
        }
    }
    return false;
}

/* Compress once; level 1: the document is mostly repeated field names, so the fastest level
 * already makes it several times smaller, and it runs once per version. */
static void compress_once(struct topo_doc *d)
{
    pthread_mutex_lock(&d->gz_mu);
    if (!d->gz_tried) {
        d->gz_tried = true;
        z_stream z = {0};
        if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16 /* gzip wrapper */, 8,
                         Z_DEFAULT_STRATEGY) == Z_OK) {
            size_t cap = deflateBound(&z, d->len);
            unsigned char *out = malloc(cap);
            z.next_in = (unsigned char *)d->text;
            z.avail_in = (uInt)d->len;
            z.next_out = out;
            z.avail_out = (uInt)cap;
            if (out && deflate(&z, Z_FINISH) == Z_STREAM_END) {
                d->gz = out;
                d->gzlen = cap - z.avail_out;
            } else {
                free(out);
            }
            deflateEnd(&z);
        }
    }
    pthread_mutex_unlock(&d->gz_mu);
}

static void release(void *arg) { topo_doc_unref(arg); }

void topo_doc_answer(struct topo_doc *d, struct admin_held *h, bool gzip)
{
    char v[24];
    snprintf(v, sizeof v, "%llu", (unsigned long long)d->version);
    if (gzip) compress_once(d);
    bool z = gzip && d->gz;
    const char *hdrs[] = {"X-Shoal-Version", v, z ? "Content-Encoding" : NULL, "gzip", NULL};
    topo_doc_ref(d);
    admin_answer_shared(h, 200, z ? (const char *)d->gz : d->text, z ? d->gzlen : d->len,
                        release, d, hdrs);
}
