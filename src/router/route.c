/* route.c — where a key's request goes and in what form: the node that owns the key's slot
 * (or the gutter pool's node while it is marked down, or every replica of a replicated pool for
 * a write), the namespace's limits and TTL rules, and the line rewrites that keep exactly one
 * reply per request on a shared upstream connection.
 *
 * Each valid request is sent on as the client wrote it, except: text `noreply` is removed (the
 * router reads the node's reply and drops it), the meta `q` flag is removed (the router drops
 * the routine reply, EN for mg and HD for ms/md/ma, as the node would have), and a TTL the
 * namespace's rules change is rewritten. `mn` is then answered by the router, in order. */
#include "router/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/policy.h"
#include "router/replica.h"
#include "router/upstream.h"
#include "router/worker.h"

int route_copy_line(struct buf *out, const char *line, size_t len, const struct proto_req *req,
                    bool strip_noreply, const char *drop, const struct line_cut *ttl)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
    if (strip_noreply) {
        size_t k = len;
        while (k && line[k - 1] != ' ') k--;
        while (k && line[k - 1] == ' ') k--;
        len = k;
    }
    struct line_cut cuts[PROTO_META_FLAGS_MAX + 1];
    int n = 0;
    for (int i = 0; drop && i < req->meta.nflags; i++) {
        const struct proto_mflag *mf = &req->meta.flag[i];
        if (mf->flag == 0 || !strchr(drop, mf->flag)) continue;
        const char *from = mf->tok - 1; /* the letter, and the spaces before it */
        while (from > line && from[-1] == ' ') from--;
        cuts[n++] = (struct line_cut){from, mf->tok + mf->ntok, NULL, 0};
    }
    if (ttl) { /* flags come in line order: keep the cuts sorted */
        int k = n++;
        while (k > 0 && cuts[k - 1].from > ttl->from) {
            cuts[k] = cuts[k - 1];
            k--;
        }
        cuts[k] = *ttl;
    }
    const char *p = line, *end = line + len;
    for (int i = 0; i < n; i++) {
        if (buf_append(out, p, (size_t)(cuts[i].from - p)) < 0 ||
            (cuts[i].ntext && buf_append(out, cuts[i].text, cuts[i].ntext) < 0))
            return -1;
        p = cuts[i].to;
    }
    if (buf_append(out, p, (size_t)(end - p)) < 0) return -1;
    return buf_append(out, "\r\n", 2);
}

/* Token number `idx` (0-based; split on spaces) of the line. */
static bool line_token(const char *line, size_t len, int idx, const char **tok, size_t *ntok)
{
    const char *p = line, *end = line + len;
    for (int t = 0; p < end; t++) {
        while (p < end && *p == ' ') p++;
        const char *s = p;
        while (p < end && *p != ' ' && *p != '\r') p++;
        if (p == s) return false;
        if (t == idx) {
            *tok = s;
            *ntok = (size_t)(p - s);
            return true;
        }
    }
    return false;
}

/* The node a key's request goes to: its owner, or, while the owner is marked down, the gutter
 * pool's node for the key (when there is one and it is up; keys never move to other regular
 * nodes). *gutter says which. In a replicated pool: this router's replica, or another one
 * while it is down or being repaired (replica.h), never the gutter. */
static uint32_t route_node(struct rworker *w, const char *key, size_t nkey, bool *gutter)
{
    uint32_t node = topo_route(w->topo, key, nkey);
    *gutter = false;
    if (replica_readable(w->map[node])) return node;
    const struct topo_pool *p = topo_pool_of(w->topo, key, nkey);
    if (p->replicated) return replica_read_node(w, p, node);
    if (upnode_up(w->map[node])) return node; /* its repairs concern replicated keys only */
    int64_t g = topo_gutter_route(w->topo, key, nkey);
    if (g < 0 || (uint32_t)g == node || !upnode_up(w->map[g])) return node; /* fails fast */
    *gutter = true;
    return (uint32_t)g;
}

/* The TTL edit the key's namespace asks for (policy.h), if any: the exptime argument of
 * set/add/replace/cas/touch, the T flag of ms and mg (added to ms when absent, since ms
 * without T means "never"). `cap`, when not 0, is a further maximum (gutter_ttl for requests
 * sent to the gutter pool). `num` holds the replacement text. */
static bool route_ttl_edit(struct client *c, const struct proto_req *req, const char *line,
                           size_t len, uint64_t cap, struct line_cut *cut, char *num,
                           size_t numcap)
{
    const struct topo_ns *own = topo_namespace(c->w->topo, req->key, req->nkey);
    struct topo_ns eff = {.default_ttl = own->default_ttl, .max_ttl = own->max_ttl};
    if (cap && (eff.max_ttl == 0 || eff.max_ttl > cap)) eff.max_ttl = cap;
    const struct topo_ns *ns = &eff;
    if (ns->default_ttl == 0 && ns->max_ttl == 0) return false;
    int64_t ttl, to;
    const char *tok = NULL;
    size_t ntok = 0;
    bool insert = false;
    switch (req->cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_CAS: case CMD_TOUCH:
        if (!line_token(line, len, req->cmd == CMD_TOUCH ? 2 : 3, &tok, &ntok)) return false;
        ttl = req->exptime;
        break;
    case CMD_MS: case CMD_MG: {
        const struct proto_mflag *t = NULL;
        for (int i = 0; i < req->meta.nflags; i++)
            if (req->meta.flag[i].flag == 'T') t = &req->meta.flag[i];
        if (t == NULL && req->cmd == CMD_MG) return false; /* no touch asked */
        if (t) {
            tok = t->tok;
            ntok = t->ntok;
            ttl = req->meta.ttl;
        } else {
            ttl = 0;
            insert = true;
        }
        break;
    }
    default:
        return false;
    }
    if (!policy_ttl(ns, ttl, (int64_t)time(NULL), &to)) return false;
    int k = snprintf(num, numcap, "%s%lld", insert ? " T" : "", (long long)to);
    if (insert) {
        const char *end = line + len;
        while (end > line && (end[-1] == '\r' || end[-1] == ' ')) end--;
        tok = end;
    }
    *cut = (struct line_cut){tok, tok + ntok, num, (size_t)k};
    c->w->m.ttl_rewrites++;
    return true;
}

/* Deletes to a pool that warms from another carry a hold-off (warm.h): `delete k` becomes
 * `delete k 2` and `md k` gets H2, unless the client chose a hold-off itself. */
static bool route_holdoff_edit(struct client *c, const struct proto_req *req, const char *line,
                               size_t len, struct line_cut *cut)
{
    if ((req->cmd != CMD_DELETE && req->cmd != CMD_MD) ||
        topo_pool_of(c->w->topo, req->key, req->nkey)->warm_from < 0)
        return false;
    const char *tok;
    size_t ntok;
    if (req->cmd == CMD_DELETE) {
        if (req->has_arg || !line_token(line, len, 1, &tok, &ntok)) return false;
        static const char two[] = " 2";
        *cut = (struct line_cut){tok + ntok, tok + ntok, two, 2};
    } else {
        if (proto_meta_has(&req->meta, 'H')) return false;
        const char *end = line + len;
        while (end > line && (end[-1] == '\r' || end[-1] == ' ')) end--;
        static const char h2[] = " H2";
        *cut = (struct line_cut){end, end, h2, 3};
    }
    return true;
}

void route_tag(const struct topo *t, struct frag *f, const char *key, size_t nkey)
{
    const struct topo_ns *ns = topo_namespace(t, key, nkey);
    f->ns = (int32_t)(ns - t->ns);
    f->pool = (int32_t)ns->pool;
}

/* Apply the key's namespace limits to one request (or one key of a multi-get) carrying
 * `nvalue` value bytes: max_value_bytes, ops_per_sec, bytes_per_sec. On a violation, answers
 * with an error naming the namespace and the limit (unless `silent`: text noreply) and
 * returns false. */
bool route_admit(struct client *c, const char *key, size_t nkey, uint64_t nvalue,
                 bool silent)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w)) return true; /* answered later as out of memory */
    /* the table is immutable except for the buckets, which are updated atomically */
    struct topo_ns *ns = (struct topo_ns *)topo_namespace(w->topo, key, nkey);
    char msg[256];
    int n = 0;
    if (ns->max_value_bytes && nvalue > ns->max_value_bytes)
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: value of %llu bytes is over "
                     "max_value_bytes %llu\r\n", ns->name, (unsigned long long)nvalue,
                     (unsigned long long)ns->max_value_bytes);
    else if (!policy_take(&ns->ops, w->now_ms, 1))
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: over ops_per_sec %llu\r\n",
                     ns->name, (unsigned long long)ns->ops.rate);
    else if (nvalue && !policy_take(&ns->bytes, w->now_ms, nvalue))
        n = snprintf(msg, sizeof msg,
                     "SERVER_ERROR shoal-router: namespace %s: over bytes_per_sec %llu\r\n",
                     ns->name, (unsigned long long)ns->bytes.rate);
    int32_t nsi = (int32_t)(ns - w->topo->ns);
    SCOPESTAT_ADD(&w->r->scopes, w->id, -1, nsi, requests);
    if (n == 0) return true;
    SCOPESTAT_ADD(&w->r->scopes, w->id, -1, nsi, refusals);
    w->m.policy_refusals++;
    if (!silent) client_local(c, msg, (size_t)n);
    return false;
}

/* Send one request to the node that owns req->key. `data` is a storage command's block with
 * its \r\n (NULL otherwise). */
void route_forward(struct client *c, const struct proto_req *req, const char *line,
                   size_t len, const char *data, size_t ndata)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w)) {
        client_oom(c);
        return;
    }
    bool gutter;
    struct upnode *un = w->map[route_node(w, req->key, req->nkey, &gutter)];
    if (gutter) w->m.gutter_requests++;
    struct rreq *rq = rreq_create(c, RQ_FORWARD, req->cmd);
    struct frag *f = rq ? frag_create(rq, 0) : NULL;
    if (f == NULL) goto oom;
    rq->noreply = req->noreply && req->cmd < CMD_MG;
    rq->quiet = req->meta.quiet && req->cmd >= CMD_MG;
    rq->frags = &rq->frag1;
    rq->frag1 = f;
    rq->nfrags = rq->pending = 1;
    route_tag(w->topo, f, req->key, req->nkey);
    struct line_cut ttl;
    char num[32];
    bool edit = route_ttl_edit(c, req, line, len, gutter ? w->topo->gutter_ttl : 0, &ttl, num,
                               sizeof num) ||
                route_holdoff_edit(c, req, line, len, &ttl);
    if (route_copy_line(&f->out, line, len, req, rq->noreply, rq->quiet ? "q" : NULL,
                        edit ? &ttl : NULL) < 0 ||
        (data && buf_append(&f->out, data, ndata) < 0))
        goto oom;
    client_enqueue(c, rq);
    upnode_submit(un, f);
    return;
oom:
    if (rq) rreq_destroy(rq); /* frees f too: it is not completed, so orphaned... */
    if (f) frag_destroy(f);   /* ...and never queued, so free it here */
    client_oom(c);
}

/* get/gets/gat/gats: one fragment when every key lives on one node (the request goes on
 * unchanged), else one per node, merged in key order when the last answers. */
void route_get(struct client *c, const struct proto_req *req, const char *line,
               size_t len)
{
    struct rworker *w = c->w;
    if (req->keys == req->keys_end || req->key == NULL) { /* gat with no keys */
        client_local_str(c, "END\r\n");
        return;
    }
    if (!worker_topology_ready(w)) {
        client_oom(c);
        return;
    }
    const char *kp = req->keys, *key;
    uint8_t nk;
    uint32_t nkeys = 0, first = UINT32_MAX;
    bool split = false, warm = false;
    while (proto_next_key(&kp, req->keys_end, &key, &nk)) {
        if (!route_admit(c, key, nk, 0, false)) return; /* the whole get is refused */
        bool gutter;
        uint32_t node = route_node(w, key, nk, &gutter);
        if (first == UINT32_MAX) first = node;
        else if (node != first) split = true;
        if (req->cmd <= CMD_GETS && topo_pool_of(w->topo, key, nk)->warm_from >= 0) warm = true;
        nkeys++;
    }
    w->m.cmd_get += nkeys;
    if (!split && !warm) {
        route_forward(c, req, line, len, NULL, 0);
        return;
    }
    if (split) w->m.multiget_split++;
    struct rreq *rq = rreq_create(c, RQ_MULTIGET, req->cmd);
    if (rq == NULL) {
        client_oom(c);
        return;
    }
    rq->nkeys_bytes = (size_t)(req->keys_end - req->keys);
    rq->keys = malloc(rq->nkeys_bytes + 1);
    rq->keyfrag = malloc(nkeys * sizeof *rq->keyfrag);
    /* a fragment per node, and room for a warm-pool lookup per key */
    size_t fcap = (w->nmap < nkeys ? w->nmap : nkeys) + (warm ? nkeys : 0);
    if (fcap > UINT16_MAX) fcap = UINT16_MAX;
    rq->fcap = (uint16_t)fcap;
    rq->warmable = warm;
    rq->frags = calloc(fcap, sizeof *rq->frags);
    if (rq->keys == NULL || rq->keyfrag == NULL || rq->frags == NULL) goto oom;
    memcpy(rq->keys, req->keys, rq->nkeys_bytes);
    rq->nkeys = nkeys;
    char prefix[40];
    const char *verb = req->cmd == CMD_GET ? "get" : req->cmd == CMD_GETS ? "gets"
                     : req->cmd == CMD_GAT ? "gat" : "gats";
    int np = (req->cmd == CMD_GAT || req->cmd == CMD_GATS)
                 ? snprintf(prefix, sizeof prefix, "%s %lld", verb, (long long)req->exptime)
                 : snprintf(prefix, sizeof prefix, "%s", verb);
    kp = req->keys;
    uint32_t *nodeof = malloc(nkeys ? sizeof(uint32_t) : 1); /* node per fragment */
    if (nodeof == NULL) goto oom;
    uint32_t i = 0;
    bool bad = false;
    while (proto_next_key(&kp, req->keys_end, &key, &nk)) {
        bool gutter;
        uint32_t node = route_node(w, key, nk, &gutter);
        if (gutter) w->m.gutter_requests++;
        int32_t fi = w->scratch[node];
        if (fi < 0) {
            struct frag *f = frag_create(rq, rq->nfrags);
            if (f == NULL || buf_append(&f->out, prefix, (size_t)np) < 0) {
                if (f) frag_destroy(f);
                bad = true;
                break;
            }
            route_tag(w->topo, f, key, nk); /* a fragment counts for its first key's namespace */
            fi = rq->nfrags++;
            rq->frags[fi] = f;
            w->scratch[node] = fi;
            uint32_t *grown = realloc(nodeof, rq->nfrags * sizeof *nodeof);
            if (grown == NULL) {
                bad = true;
                break;
            }
            nodeof = grown;
            nodeof[fi] = node;
        }
        rq->keyfrag[i++] = (uint16_t)fi;
        struct buf *o = &rq->frags[fi]->out;
        if (buf_append(o, " ", 1) < 0 || buf_append(o, key, nk) < 0) {
            bad = true;
            break;
        }
    }
    for (uint16_t k = 0; k < rq->nfrags; k++) {
        w->scratch[nodeof[k]] = -1;
        if (buf_append(&rq->frags[k]->out, "\r\n", 2) < 0) bad = true;
    }
    if (bad) {
        free(nodeof);
        for (uint16_t k = 0; k < rq->nfrags; k++) frag_destroy(rq->frags[k]);
        rq->nfrags = 0;
        goto oom;
    }
    rq->pending = rq->nfrags;
    client_enqueue(c, rq);
    /* The last submission may complete the request at once (a node marked down fails it) and
     * free it, so nothing of rq is read after it. */
    uint16_t nfrags = rq->nfrags;
    for (uint16_t k = 0; k < nfrags; k++) upnode_submit(w->map[nodeof[k]], rq->frags[k]);
    free(nodeof);
    return;
oom:
    rreq_destroy(rq);
    client_oom(c);
}

/* Send one request to several nodes (`nodes`, indices into the topology's nodes) and answer
 * with the merged reply (request.c merge_all): flush_all to every node, writes to every
 * replica of a replicated pool. `data` is a storage command's block (or NULL). A node that
 * fails its part is repaired later (replica.h). */
static void route_fanout(struct client *c, const struct proto_req *req, const char *line,
                         size_t len, const char *data, size_t ndata, const uint32_t *nodes,
                         uint32_t n, const struct line_cut *ttl)
{
    struct rreq *rq = rreq_create(c, RQ_ALL, req->cmd);
    if (rq == NULL || (rq->frags = calloc(n, sizeof *rq->frags)) == NULL) goto oom;
    rq->noreply = req->noreply && req->cmd < CMD_MG;
    rq->quiet = req->meta.quiet && req->cmd >= CMD_MG;
    for (uint32_t i = 0; i < n; i++) {
        struct frag *f = frag_create(rq, (uint16_t)i);
        if (f == NULL) goto oom;
        rq->frags[rq->nfrags++] = f;
        if (req->key && req->nkey) route_tag(c->w->topo, f, req->key, req->nkey);
        if (replica_tag(f, c->w->map[nodes[i]],
                        req->cmd == CMD_FLUSH_ALL ? REPL_FLUSH_ALL : REPL_WRITE, req->key,
                        req->nkey) < 0)
            goto oom;
        if (route_copy_line(&f->out, line, len, req, rq->noreply, rq->quiet ? "q" : NULL,
                            ttl) < 0 ||
            (data && buf_append(&f->out, data, ndata) < 0))
            goto oom;
    }
    rq->pending = rq->nfrags;
    client_enqueue(c, rq);
    for (uint32_t i = 0; i < n; i++) upnode_submit(c->w->map[nodes[i]], rq->frags[i]);
    return;
oom:
    if (rq) {
        for (uint16_t k = 0; k < rq->nfrags; k++) frag_destroy(rq->frags[k]);
        rq->nfrags = 0;
        rreq_destroy(rq);
    }
    client_oom(c);
}

/* flush_all goes to every node of the topology. */
void route_all(struct client *c, const struct proto_req *req, const char *line,
               size_t len)
{
    struct rworker *w = c->w;
    uint32_t *nodes = worker_topology_ready(w) ? malloc(w->nmap * sizeof *nodes) : NULL;
    if (nodes == NULL) {
        client_oom(c);
        return;
    }
    for (uint32_t i = 0; i < w->nmap; i++) nodes[i] = i;
    /* a node that misses it (down, or failing) is flushed when it can be repaired */
    route_fanout(c, req, line, len, NULL, 0, nodes, w->nmap, NULL);
    free(nodes);
}

/* Does this command change the item (so a replicated pool sends it to every replica)? */
static bool cmd_writes(enum proto_cmd cmd)
{
    switch (cmd) {
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_APPEND: case CMD_PREPEND:
    case CMD_CAS: case CMD_DELETE: case CMD_INCR: case CMD_DECR: case CMD_TOUCH:
    case CMD_MS: case CMD_MD: case CMD_MA:
        return true;
    default:
        return false;
    }
}

/* A write to a key of a replicated pool: to every replica not marked down. Returns false when
 * the key's pool is not replicated (the caller routes it as usual). */
bool route_replicate(struct client *c, const struct proto_req *req, const char *line,
                     size_t len, const char *data, size_t ndata)
{
    struct rworker *w = c->w;
    if (!worker_topology_ready(w) || !cmd_writes(req->cmd)) return false;
    const struct topo_pool *p = topo_pool_of(w->topo, req->key, req->nkey);
    if (!p->replicated) return false;
    struct line_cut ttl;
    char num[32];
    bool edit = route_ttl_edit(c, req, line, len, 0, &ttl, num, sizeof num) ||
                route_holdoff_edit(c, req, line, len, &ttl);
    w->m.replicated_writes++;
    if (replica_is_compare(req)) { /* on the replica reads go to, then the others */
        replica_compare(c, req, line, len, data, ndata, p, edit ? &ttl : NULL);
        return true;
    }
    uint32_t *nodes = malloc(p->nnodes * sizeof *nodes), n = 0;
    if (nodes == NULL) {
        client_oom(c);
        return true;
    }
    for (uint32_t i = 0; i < p->nnodes; i++) {
        struct upnode *un = w->map[p->nodes[i]];
        if (upnode_up(un)) nodes[n++] = p->nodes[i];
        else replica_log(un, req->key, req->nkey, false); /* deleted when it is back */
    }
    if (n == 0) nodes[n++] = p->nodes[0]; /* all down: fails at once with the reason */
    route_fanout(c, req, line, len, data, ndata, nodes, n, edit ? &ttl : NULL);
    free(nodes);
    return true;
}
