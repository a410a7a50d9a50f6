/* Per-node aggregates: slots, merging, clearing, the estimates' pending calls; the trace ring's storage. */
#include "stats.h"   /* first: Python.h sets the feature macros */

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "items.h"
#include "memory.h"

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

_Static_assert(sizeof(CellPair) % sizeof(double) == 0, "CellPair: double sums only");

void *stats_room(void *p, int32_t *n, int32_t need, size_t size) {
    if (need <= *n) return p;
    char *x = realloc(p, (size_t)need * size);
    if (!x) return NULL;
    memset(x + (size_t)*n * size, 0, (size_t)(need - *n) * size);
    *n = need;
    return x;
}

int stats_reserve(NodeStats *s, int nq) {
    if (nq <= s->n_q) return 0;
    for (int b = 0; b < STRATA; b++) {
        if (!s->cells[b]) continue;
        CellPair *c = realloc(s->cells[b], (size_t)nq * sizeof(CellPair));
        if (!c) return -1;
        memset(c + s->n_q, 0, (size_t)(nq - s->n_q) * sizeof(CellPair));
        s->cells[b] = c;
    }
    uint64_t *r = realloc(s->reads, (size_t)nq * sizeof(uint64_t));
    if (!r) return -1;
    memset(r + s->n_q, 0, (size_t)(nq - s->n_q) * sizeof(uint64_t));
    s->reads = r;
    s->n_q = nq;
    return 0;
}

CellPair *stats_cells(NodeStats *s, int b) {
    if (!s->cells[b] && s->n_q) s->cells[b] = calloc((size_t)s->n_q, sizeof(CellPair));
    return s->cells[b];
}

/* Quantity q's cells of one side (own: self, else the totals), by stratum; an empty cell where it has none. */
typedef const Cell *Side[STRATA];
static const Cell NO_CELL;

static void side_of(const NodeStats *s, int q, int own, Side c) {
    for (int b = 0; b < STRATA; b++)
        c[b] = q < s->n_q && s->cells[b] ? (own ? &s->cells[b][q].own : &s->cells[b][q].tot) : &NO_CELL;
}

/* The sums of stratum b of cells c, or of all strata (b = -1). */
typedef struct { double n, x, w, xx, xw, ww, Wn, Wx, Ww; } Sums;

static Sums sums(const Side c, int b) {
    Sums m = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = b < 0 ? 0 : b; k < (b < 0 ? STRATA : b + 1); k++) {
        const Cell *x = c[k];
        m.n += x->n, m.x += x->x, m.w += x->w, m.xx += x->xx, m.xw += x->xw, m.ww += x->ww;
        m.Wn += x->Wn, m.Wx += x->Wx, m.Ww += x->Ww;
    }
    return m;
}

/* A fit to read calls: the quantity per running ns (a = 0, r the ratio) or per call (a the mean, r = 0), whichever
 * has the smaller squared error over them, or per call where asked (per_call); the ratio and mean weighted by 1 / p
 * (each read call stands for 1 / p calls, whatever its chance was when it was read).  mse: its mean squared error,
 * -1 below two reads. */
typedef struct { double a, r, mse; } Fit;

static Fit fit(const Sums *m, int per_call) {
    double ratio = m->Ww > 0 ? m->Wx / m->Ww : 0, mean = m->Wn > 0 ? m->Wx / m->Wn : 0;
    double sse_w = m->xx - 2 * ratio * m->xw + ratio * ratio * m->ww;
    double sse_c = m->xx - 2 * mean * m->x + mean * mean * m->n;
    Fit f = per_call || sse_c < sse_w ? (Fit){mean, 0, sse_c} : (Fit){0, ratio, sse_w};
    f.mse = m->n >= 2 ? fmax(f.mse, 0) / (m->n - 1) : -1;
    return f;
}

/* Whether quantity q of calls that left the CPU is predicted per call: their running time holds their time off
 * the CPU (a preempted call of 80 µs of work can run 4 ms), which says nothing of their own work (CPU time, system
 * time, counters); their run-queue time, the helper threads' CPU and
 * the GIL sampler's samples meanwhile grow with it. */
static int per_call(int q, int switched) { return switched && q != Q_RQ && q != Q_HELPERS && q != Q_OFF && q != Q_GIL; }

/* The fit a call of stratum b is predicted by: its stratum's, or all strata's where its stratum has no read. */
static Fit fit_for(const Side c, int q, int b) {
    Sums m = sums(c, c[b]->n ? b : -1);
    return fit(&m, per_call(q, b >= STRATA_RUN));
}

double stats_predict(const NodeStats *s, int q, double run, int switched) {
    if (!stats_reads(s, q)) return 0.0;
    Side c;
    side_of(s, q, 0, c);
    Fit f = fit_for(c, q, stratum(run, switched));
    return f.a + f.r * run;
}

double stats_read_sum(const NodeStats *s, int q) {
    Side c;
    side_of(s, q, 0, c);
    return sums(c, -1).x;
}

double stats_read_run(const NodeStats *s, int q) {
    Side c;
    side_of(s, q, 0, c);
    return sums(c, -1).w;
}

static int bounded(int q) { return q == Q_CPU || q == Q_SYS || q == Q_RQ; }   /* by a call's running time */

#define FEW_READS 5   /* below this many reads, a stratum's own spread is not trusted alone */

/* The prediction of n unread calls of running time w in all, from the read calls' sums m (nb of them in the calls'
 * own stratum; m is all strata's where nb is 0), with its variance: the calls' own errors about the fit and the
 * fit's error, each call's error taken as the fit's mean squared error.  Below FEW_READS reads, no smaller than a
 * guess: for a quantity bounded by the running time, the running time (where no call of the stratum was read, the
 * prediction is held to [0, w], and for calls that left the CPU the 99 % interval spans it); else as large as the
 * prediction itself, or as the largest error per running ns of any stratum with two reads (rel); for calls that
 * left the CPU, no smaller than the mean per call of the reads that stayed on it weighted by their running time
 * (onw): a preemption falls on a call in proportion to its time on a CPU, so under load the calls that left it are
 * the longer ones, and a few reads of them need not show it.  Where the stratum's reads fit exactly (a
 * counter that read 0 on each), the unread calls may still hold a kind none of those reads saw, at a rate below
 * 3 / reads at 95 % (the rule of three): each call's error is then taken no smaller than that share of the spread
 * per call of all the stage's reads (pool), so a rare heavy kind read elsewhere widens the interval here too. */
static void predict_unread(const Sums *m, double nb, int q, int switched, double n, double w, double rel, double pool,
                           double onw, double *pred, double *var) {
    Fit f = fit(m, per_call(q, switched));
    *pred = f.a * n + f.r * w;
    double run = w / n, g = f.mse;
    if (nb < FEW_READS) {
        if (bounded(q) && !nb) {   /* within [0, w]; a call that left the CPU anywhere in it (the interval spans it) */
            *pred = fmin(fmax(*pred, 0), w);
            double off = fmax(*pred, w - *pred) / 2.576;
            *var = off * off;
            return;
        }
        double one = bounded(q) ? run : fmax(fabs(*pred / n), sqrt(rel) * run);
        if (switched && !bounded(q)) one = fmax(one, onw);
        g = fmax(g, one * one);
    }
    if (g == 0 && nb) g = pool * fmin(3 / nb, 1);
    *var = n * g + g * (!nb ? n * n : f.r ? w * w / m->ww : n * n / m->n);
}

/* The largest mean squared error per running ns squared of the strata of c with two reads or more. */
static double worst_relative_error(const Side c) {
    double rel = 0;
    for (int b = 0; b < STRATA; b++) {
        Sums m = sums(c, b);
        Fit f = fit(&m, 0);
        if (f.mse >= 0 && m.w > 0) rel = fmax(rel, f.mse / (m.w / m.n * m.w / m.n));
    }
    return rel;
}

/* The spread per call of all the read calls of c about their mean (0 below two reads). */
static double pooled_spread(const Side c) {
    Sums m = sums(c, -1);
    return m.n >= 2 ? fmax(m.xx - m.x * m.x / m.n, 0) / (m.n - 1) : 0;
}

/* The mean per call of the read calls that stayed on the CPU, each weighted by its running time: what a call
 * picked in proportion to its time on a CPU (a preempted one) holds on average (0 without such reads). */
static double on_cpu_weighted_mean(const Side c) {
    double xw = 0, w = 0;
    for (int b = 0; b < STRATA_RUN; b++) xw += c[b]->xw, w += c[b]->w;
    return w > 0 ? fabs(xw / w) : 0;
}

/* One side of the estimate (the totals, or self): the read calls' values, and the unread calls of each stratum
 * (un, uw: the node's, plus the calls that did not measure this quantity) predicted from its read calls. */
static void estimate_side(const Side c, const double *un, const double *uw, int q, double *sum, double *var) {
    double rel = worst_relative_error(c), pool = pooled_spread(c), onw = on_cpu_weighted_mean(c), pred, v;
    *sum = *var = 0;
    for (int b = 0; b < STRATA; b++) {
        double n = un[b] + c[b]->un, w = uw[b] + c[b]->uw;
        *sum += c[b]->x;
        if (!n) continue;
        Sums m = sums(c, c[b]->n ? b : -1);
        predict_unread(&m, c[b]->n, q, b >= STRATA_RUN, n, w, rel, pool, onw, &pred, &v);
        *sum += pred;
        *var += v;
    }
}

/* The estimate, separate ratio (or mean) estimators by stratum: the read calls' values, and the unread calls
 * predicted by the fit to the read calls of their stratum.  Over the calls a read stands for, the fit is unbiased
 * to the order of 1 / reads (the weights by 1 / p keep it so when the chance changes along a run); its variance
 * is the unread calls' prediction errors'.  Self likewise, over running self time.  Every call read: exact. */
void stats_estimate(const NodeStats *s, int q, double *total, double *self, double *var, double *var_self) {
    Side tot, own;
    side_of(s, q, 0, tot);
    side_of(s, q, 1, own);
    estimate_side(tot, s->un, s->uw, q, total, var);
    estimate_side(own, s->un, s->uws, q, self, var_self);
}

void stats_mark_start(NodeStats *s, int64_t back) {
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return;
    s->cpu0 = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec - back;
    s->cpu0_set = 1;
}

double stats_mean_cpu(const NodeStats *s) {   /* a stratum none of whose calls was read: on a CPU throughout */
    return s->cpu_pred / (double)s->covered;
}

Blocker *stats_blocker(NodeStats *s, int32_t node) {
    for (int32_t k = 0; k < s->n_blockers; k++)
        if (s->blockers[k].node == node) return &s->blockers[k];
    if (node != -1 && s->n_blockers >= BLOCKERS_MAX - 1) return stats_blocker(s, -1);   /* full: the last adds up the rest */
    if (s->n_blockers >= BLOCKERS_MAX) return NULL;
    if (!s->blockers && !(s->blockers = malloc(BLOCKERS_MAX * sizeof(Blocker)))) return NULL;
    s->blockers[s->n_blockers] = (Blocker){node, 0, 0, 0};
    return &s->blockers[s->n_blockers++];
}

static void merge_blockers(NodeStats *d, const NodeStats *s) {
    for (int32_t k = 0; k < s->n_blockers; k++) {
        Blocker *b = stats_blocker(d, s->blockers[k].node);
        if (b) b->held += s->blockers[k].held, b->waited += s->blockers[k].waited;
    }
}

static int merge_estimates(NodeStats *d, const NodeStats *s) {
    if (stats_reserve(d, s->n_q) < 0) return -1;
    for (int q = 0; q < s->n_q; q++) d->reads[q] += s->reads[q];
    for (int b = 0; b < STRATA; b++) {
        if (!s->cells[b]) continue;
        CellPair *to = stats_cells(d, b);
        if (!to) return -1;
        double *a = (double *)to;
        const double *x = (const double *)s->cells[b];
        for (size_t k = 0; k < (size_t)s->n_q * (sizeof(CellPair) / sizeof(double)); k++) a[k] += x[k];
    }
    return 0;
}

static int merge_counters(NodeStats *d, const NodeStats *s) {
    CounterStat *c = stats_room(d->ctr, &d->n_ctr, s->n_ctr, sizeof(CounterStat));
    if (!c) return -1;
    d->ctr = c;
    for (int k = 0; k < s->n_ctr; k++) {
        d->ctr[k].enabled += s->ctr[k].enabled;
        d->ctr[k].running += s->ctr[k].running;
        d->ctr[k].scaled += s->ctr[k].scaled;
    }
    return 0;
}

/* Adds the slot s into d. */
static int stats_merge(NodeStats *d, const NodeStats *s, int64_t cpu_now) {
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
    for (int k = 0; k < STRATA; k++)
        d->run_b[k] += s->run_b[k], d->calls_b[k] += s->calls_b[k], d->un[k] += s->un[k], d->uw[k] += s->uw[k],
        d->uws[k] += s->uws[k];
    d->cpu_pred += s->cpu_pred;
    d->cov_run += s->cov_run;
    d->cpu_bound += cpu_now < 0 ? s->cpu_bound : s->cpu0_set ? (double)(cpu_now - s->cpu0) : INFINITY;
    d->cov_run_self += s->cov_run_self;
    merge_blockers(d, s);   /* held sums: the slots are other threads' loops, or disjoint stretches of time */
    if (s->reads && merge_estimates(d, s) < 0) return -1;
    if (s->ctr && merge_counters(d, s) < 0) return -1;
    if (s->mem) {
        MemStat *m = stats_room(d->mem, &d->n_mem, s->n_mem, sizeof(MemStat));
        if (!m) return -1;
        mem_stat_merge(d->mem = m, s->mem, s->n_mem);
    }
    return hist_merge(&d->h, &s->h);
}

void stats_array_clear(StatsArray *a) {
    for (int32_t i = 0; i < a->n; i++) {
        if (a->v[i]) {
            hist_clear(&a->v[i]->h);
            items_clear(a->v[i]);
            for (int b = 0; b < STRATA; b++) free(a->v[i]->cells[b]);
            free(a->v[i]->reads);
            free(a->v[i]->ctr);
            free(a->v[i]->blockers);
            free(a->v[i]->mem);
            free(a->v[i]);
        }
    }
    free(a->v);
    a->v = NULL;
    a->n = 0;
}

int stats_array_merge(StatsArray *into, const StatsArray *from, int64_t cpu_now) {
    for (int32_t i = 0; i < from->n; i++) {
        NodeStats *s = from->v[i];
        if (!s || (!s->calls && !s->n_items)) continue;
        NodeStats *d = stats_get(into, i);
        if (!d || stats_merge(d, s, cpu_now) < 0) return -1;
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
