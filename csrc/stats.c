/* Per-node aggregates: slots, merging, clearing, the estimates' pending calls; the trace ring's storage. */
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

int stats_quantities(void) { return Q_CTR + g_ctr_n; }

double stats_predict(const Estimate *e, double run, int self) {
    if (!e->reads) return 0.0;
    double x = self ? e->rxs : e->rx, w = self ? e->rws : e->rw;
    if (e->sse_c < e->sse_w) return x / (double)e->reads;   /* the mean per call has predicted better */
    return w > 0 ? x / w * run : 0.0;
}

void stats_flush(NodeStats *s) {
    if (!s->est || s->pend_n == 0) return;
    for (int q = 0; q < stats_quantities(); q++) {   /* both predictions are linear: one per pending sum */
        Estimate *e = &s->est[q];
        int per_call = e->reads && e->sse_c < e->sse_w;
        e->est += per_call ? stats_predict(e, 0, 0) * s->pend_n : stats_predict(e, s->pend_w, 0);
        e->est_self += per_call ? stats_predict(e, 0, 1) * s->pend_n : stats_predict(e, s->pend_ws, 1);
    }
    s->pend_w = s->pend_ws = s->pend_n = 0;
}

void stats_add_blocker(NodeStats *s, int32_t node, int64_t ns) {
    for (int32_t k = 0; k < s->n_blockers; k++)
        if (s->blockers[k].node == node) { s->blockers[k].ns += ns; return; }
    if (node != -1 && s->n_blockers >= BLOCKERS_MAX - 1) {   /* full: the last entry adds up the rest */
        stats_add_blocker(s, -1, ns);
        return;
    }
    if (s->n_blockers < BLOCKERS_MAX) s->blockers[s->n_blockers++] = (Blocker){node, ns};
}

static int merge_estimates(NodeStats *d, const NodeStats *s) {
    if (!d->est && !(d->est = calloc(Q_MAX, sizeof(Estimate)))) return -1;
    for (int q = 0; q < Q_MAX; q++) {
        Estimate *a = &d->est[q];
        const Estimate *b = &s->est[q];
        a->est += b->est, a->est_self += b->est_self, a->var += b->var, a->var_self += b->var_self;
        a->rx += b->rx, a->rw += b->rw, a->rxs += b->rxs, a->rws += b->rws, a->reads += b->reads;
        a->sse_w += b->sse_w, a->sse_c += b->sse_c;
    }
    return 0;
}

static int merge_counters(NodeStats *d, const NodeStats *s) {
    if (!d->ctr && !(d->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat)))) return -1;
    for (int k = 0; k < PERF_MAX_EVENTS; k++) {
        d->ctr[k].enabled += s->ctr[k].enabled;
        d->ctr[k].running += s->ctr[k].running;
        d->ctr[k].scaled += s->ctr[k].scaled;
    }
    return 0;
}

/* `s` flushed (its pending calls in its estimates) before it is added. */
static int stats_merge(NodeStats *d, const NodeStats *s) {
    if (s->n_items && items_merge(d, s) < 0) return -1;
    if (!s->calls) return 0;
    d->calls += s->calls;
    d->errors += s->errors;
    d->wall_total += s->wall_total;
    d->wall_self += s->wall_self;
    if (s->wall_min < d->wall_min) d->wall_min = s->wall_min;
    if (s->wall_max > d->wall_max) d->wall_max = s->wall_max;
    d->overlapped += s->overlapped;
    d->abandoned += s->abandoned;
    d->susp_total += s->susp_total;
    d->susp_self += s->susp_self;
    d->loop_total += s->loop_total;
    d->loop_self += s->loop_self;
    d->covered += s->covered;
    d->cov_run += s->cov_run;
    d->cov_run_self += s->cov_run_self;
    for (int32_t k = 0; k < s->n_blockers; k++) stats_add_blocker(d, s->blockers[k].node, s->blockers[k].ns);
    if (s->est && merge_estimates(d, s) < 0) return -1;
    if (s->ctr && merge_counters(d, s) < 0) return -1;
    return hist_merge(&d->h, &s->h);
}

void stats_array_clear(StatsArray *a) {
    for (int32_t i = 0; i < a->n; i++) {
        if (a->v[i]) {
            hist_clear(&a->v[i]->h);
            items_clear(a->v[i]);
            free(a->v[i]->est);
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
        NodeStats *s = from->v[i];
        if (!s || (!s->calls && !s->n_items)) continue;
        stats_flush(s);
        NodeStats *d = stats_get(into, i);
        if (!d || stats_merge(d, s) < 0) return -1;
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
