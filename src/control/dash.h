/* dash.h — the dashboard shoal-control serves on its admin listener (docs/operations.md):
 *
 *   GET /                   the page (HTML; its own script and style, nothing from a network)
 *   GET /static/dash.js     the page's script: fetches /v1/stats every interval, fills the
 *                           pools table and updates the charts in place
 *   GET /static/chart.js    Chart.js, read at start from --chart-js (Debian's libjs-chart.js)
 *   GET /v1/stats[?since=N] the figures as JSON (sampler.h), only samples after N with since=
 *
 * The page and script are built into the binary (dash.c); without the Chart.js file the page
 * still shows the tables and latest figures, and says the charts are missing. */
#ifndef SHOAL_CONTROL_DASH_H
#define SHOAL_CONTROL_DASH_H

#include <stddef.h>

struct buf;

/* Read Chart.js from `chart_js` (a warning when it cannot be read). Before the listener. */
void dash_setup(const char *chart_js);
void dash_teardown(void);

/* admin routes (common/admin.h); ctx is the struct control */
int dash_page_route(void *ctx, const char *method, const char *rest, const char *body,
                    size_t len, struct buf *out);
int dash_static_route(void *ctx, const char *method, const char *rest, const char *body,
                      size_t len, struct buf *out);
int dash_stats_route(void *ctx, const char *method, const char *rest, const char *body,
                     size_t len, struct buf *out);

#endif
