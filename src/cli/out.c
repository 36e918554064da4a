/* out.c — how the CLI prints: aligned text tables, sizes in K/M/G, JSON, error lines. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define TABLE_COLS_MAX 12

struct cli_table {
    int ncols, nrows, cap;
    char **cells; /* nrows * ncols, row 0 the header */
};

struct cli_table *cli_table_new(int ncols, ...)
{
    struct cli_table *t = calloc(1, sizeof *t);
    if (t == NULL || ncols > TABLE_COLS_MAX) {
        free(t);
        return NULL;
    }
    t->ncols = ncols;
    va_list ap;
    va_start(ap, ncols);
    char *hdr[TABLE_COLS_MAX] = {0};
    for (int i = 0; i < ncols; i++) hdr[i] = va_arg(ap, char *);
    va_end(ap);
    cli_table_row(t, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[6], hdr[7], hdr[8],
                  hdr[9], hdr[10], hdr[11]);
    return t;
}

void cli_table_row(struct cli_table *t, ...)
{
    if (t == NULL) return;
    if (t->nrows == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        char **c = realloc(t->cells, (size_t)cap * (size_t)t->ncols * sizeof *c);
        if (c == NULL) return;
        t->cells = c;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, t);
    for (int i = 0; i < t->ncols; i++) {
        const char *s = va_arg(ap, const char *);
        t->cells[t->nrows * t->ncols + i] = strdup(s ? s : "-");
    }
    va_end(ap);
    t->nrows++;
}

void cli_table_print(struct cli_table *t, int indent)
{
    if (t == NULL) return;
    size_t w[TABLE_COLS_MAX] = {0};
    for (int r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            size_t n = s ? strlen(s) : 1;
            if (n > w[c]) w[c] = n;
        }
    for (int r = 0; r < t->nrows; r++) {
        printf("%*s", indent, "");
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            if (c == t->ncols - 1) printf("%s\n", s ? s : "-");
            else printf("%-*s  ", (int)w[c], s ? s : "-");
        }
    }
}

void cli_table_free(struct cli_table **tp)
{
    struct cli_table *t = *tp;
    if (t == NULL) return;
    for (int i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
    free(t->cells);
    free(t);
    *tp = NULL;
}

const char *cli_human(uint64_t bytes, char *out, size_t len)
{
    static const char units[] = "KMGTP";
    if (bytes < 1024) {
        snprintf(out, len, "%llu", (unsigned long long)bytes);
        return out;
    }
    double v = (double)bytes;
    int u = -1;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (v == (double)(uint64_t)v) snprintf(out, len, "%llu%c", (unsigned long long)v, units[u]);
    else snprintf(out, len, "%.1f%c", v, units[u]);
    return out;
}

void cli_print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (s) printf("%s\n", s);
    free(s);
    fflush(stdout);
}

int cli_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}
