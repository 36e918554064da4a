/* seq.c — setup of the cache-aside key sequence, see seq.h. */
#include "bench/seq.h"

#include <string.h>

void bench_seq_init(struct bench_seq *s, const struct bench_opts *o, const struct bench_keys *k,
                    const struct bench_zipf *zipf, unsigned id, unsigned threads)
{
    memset(s, 0, sizeof(*s));
    /* The same stream as the mixed mode's generator for this thread. */
    bench_rng_seed(&s->rng, o->seed, id);
    s->keys = k;
    s->zipf = o->dist == BENCH_DIST_ZIPF ? zipf : NULL;
    s->scan_every = o->scan_every;
    s->scan_length = o->scan_length;
    s->scan_keys = o->scan_keys;
    if (s->scan_every)
        s->scan_pos = (uint64_t)((unsigned __int128)o->scan_keys * id / (threads ? threads : 1));
}
