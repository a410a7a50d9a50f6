/* Per-node aggregates: slots, merging, clearing; the trace ring's storage. */
#include "stats.h"   /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include "items.h"

TraceEvent *g_ring = NULL;
size_t g_ring_cap = 0, g_ring_next = 0;
uint64_t g_ring_total = 0;

NodeStats *stats_slot_new(StatsArray *a, int32_t node) {
    if (node >= a->n) {
        int32_t nn = a->n ? a->n : 16;
        while (nn <= node) nn *= 2;
        NodeStats **v = realloc(a->v, (size_t)nn * sizeof(NodeStats *));
        if (!v) return NULL;
        memset(v + a->n, 0, (size_t)(nn - a->n) * sizeof(NodeStats *));
        a->v = v;
        a->n = nn;
    }
    NodeStats *s = a->v[node];
    if (!s) {
        s = calloc(1, sizeof(NodeStats));
        if (!s) return NULL;
        s->wall_min = INT64_MAX;
        a->v[node] = s;
    }
    return s;
}

static int stats_merge(NodeStats *d, const NodeStats *s) {
    if (s->n_items && items_merge(d, s) < 0) return -1;
    if (!s->calls) return 0;
    d->calls += s->calls;
    d->errors += s->errors;
    d->cpu_calls += s->cpu_calls;
    d->wall_total += s->wall_total;
    d->wall_self += s->wall_self;
    d->cpu_total += s->cpu_total;
    d->cpu_self += s->cpu_self;
    d->cpu_reads += s->cpu_reads;
    d->cpu_wsum += s->cpu_wsum;
    d->cpu_wall_w += s->cpu_wall_w;
    d->cpu_cov_wall += s->cpu_cov_wall;
    d->sys_reads += s->sys_reads;
    d->sys_total += s->sys_total;
    d->sys_self += s->sys_self;
    d->sys_cpu_total += s->sys_cpu_total;
    d->sys_cpu_self += s->sys_cpu_self;
    if (s->wall_min < d->wall_min) d->wall_min = s->wall_min;
    if (s->wall_max > d->wall_max) d->wall_max = s->wall_max;
    d->overlapped += s->overlapped;
    d->abandoned += s->abandoned;
    d->susp_total += s->susp_total;
    d->susp_self += s->susp_self;
    if (s->ctr) {
        if (!d->ctr && !(d->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat)))) return -1;
        for (int k = 0; k < PERF_MAX_EVENTS; k++) {
            d->ctr[k].total += s->ctr[k].total;
            d->ctr[k].self += s->ctr[k].self;
            d->ctr[k].enabled += s->ctr[k].enabled;
            d->ctr[k].running += s->ctr[k].running;
            d->ctr[k].counted += s->ctr[k].counted;
            d->ctr[k].covered += s->ctr[k].covered;
            d->ctr[k].wsum += s->ctr[k].wsum;
            d->ctr[k].scaled += s->ctr[k].scaled;
        }
    }
    return hist_merge(&d->h, &s->h);
}

void stats_array_clear(StatsArray *a) {
    for (int32_t i = 0; i < a->n; i++) {
        if (a->v[i]) {
            hist_clear(&a->v[i]->h);
            items_clear(a->v[i]);
            free(a->v[i]->ctr);
            free(a->v[i]);
        }
    }
    free(a->v);
    a->v = NULL;
    a->n = 0;
}

int stats_array_merge(StatsArray *into, const StatsArray *from) {
    for (int32_t i = 0; i < from->n; i++) {
        if (!from->v[i] || (!from->v[i]->calls && !from->v[i]->n_items)) continue;
        NodeStats *d = stats_get(into, i);
        if (!d || stats_merge(d, from->v[i]) < 0) return -1;
    }
    return 0;
}

int trace_resize(size_t cap) {
    TraceEvent *r = NULL;
    if (cap && !(r = calloc(cap, sizeof(TraceEvent)))) return -1;
    free(g_ring);
    g_ring = r;
    g_ring_cap = cap;
    g_ring_next = 0;
    g_ring_total = 0;
    return 0;
}
