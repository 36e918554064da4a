/* fuzz_control.c — libFuzzer target for shoal-control's model (src/control/model.c): any bytes,
 * read as a state file or as the body of any change, must give a valid model or a refusal that
 * names a field and a rule; never a crash, an over-read or a leak. Whatever passes the whole
 * check (every pool's slot map covering and even among them) must render a topology document. */
#include <stdint.h>
#include <string.h>

#include "control/model.h"

static json_t *base(void)
{
    json_t *m = model_new();
    struct model_err e;
    const char *name;
    json_t *b = json_loads("{\"name\": \"main\", \"nodes\": [\"10.0.0.1:1\", \"10.0.0.2:1\", "
                           "{\"node\": \"10.0.0.3:1\", \"admin\": \"10.0.0.3:2\"}]}",
                           0, NULL);
    if (model_pool_create(m, b, &name, &e) != 0) __builtin_trap();
    json_decref(b);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    struct model_err e;
    json_t *in = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
    if (in == NULL) return 0;
    int st;
    json_t *m;
    if (data[0] % 7 == 0) { /* a state file */
        m = json_incref(in);
        st = model_check(m, &e);
    } else {
        m = base();
        const char *name = NULL;
        uint32_t moved;
        const char *key = json_is_object(in) ? json_string_value(json_object_get(in, "name")) : NULL;
        switch (data[0] % 7) {
        case 1: st = model_ns_create(m, in, &name, &e); break;
        case 2: st = model_ns_update(m, "default", in, &e); break;
        case 3: st = model_pool_create(m, in, &name, &e); break;
        case 4: st = model_node_add(m, "main", in, &moved, &e); break;
        case 5: st = model_node_remove(m, "main", key ? key : "10.0.0.2:1", &moved, &e); break;
        default: st = model_ns_delete(m, key ? key : "default", &e); break;
        }
        if (st == 0) st = model_check(m, &e); /* as the API does: the change, then the whole */
    }
    if (st != 0) {
        if (e.field[0] == 0 || e.rule[0] == 0 || e.msg[0] == 0 || st < 400) __builtin_trap();
    } else {
        json_t *doc = model_topology(m);
        if (doc == NULL) __builtin_trap();
        json_decref(doc);
    }
    json_decref(m);
    json_decref(in);
    return 0;
}
