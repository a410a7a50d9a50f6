/* Recording a finished call (record.h): the SDK's own cost taken out, the
 * call's part of each estimate (stats.h), the parent frame's child sums, and the
 * node's slot on the recording thread.
 *
 * The estimates (stats.c stats_estimate) come from sums: a read call adds its
 * values to its stratum's (by running time), an unread one only its running time;
 * the unread calls are predicted from the read calls of their stratum when the
 * estimate is asked for, so an early read call's place in the run does not weigh
 * on its stratum's later calls.  A stage read on every call has exact sums. */
#include "record.h"   /* first: Python.h sets the feature macros */

#include <math.h>
#include <stdlib.h>

#include "hist.h"
#include "stats.h"

void call_quantities(const Reading *r0, const Reading *r1, CallMeasure *m) {
    for (int q = 0; q < Q_MAX; q++) m->x[q] = NAN;
    for (int q = 0; q < Q_SCALARS; q++)
        if (r0->q[q] >= 0 && r1->q[q] >= 0 && (q != Q_CPU || r0->cpu_src == r1->cpu_src))
            m->x[q] = (double)(r1->q[q] - r0->q[q]);
    m->have_ctr = r0->ctr_gen && r0->ctr_gen == r1->ctr_gen && r0->ctr_gen == g_ctr_gen;
    for (int k = 0; m->have_ctr && k < g_ctr_n; k++) {
        uint64_t dv = r1->c.value[k] - r0->c.value[k];
        uint64_t en = r1->c.enabled[k] - r0->c.enabled[k], run = r1->c.running[k] - r0->c.running[k];
        m->cen[k] = en;
        m->crun[k] = run;
        /* multiplexed: scale by enabled/running; never ran: no value (not 0) */
        m->x[Q_CTR + k] = run == 0 ? NAN : run == en ? (double)dv : (double)dv * ((double)en / (double)run);
    }
}

/* The SDK's own work inside a call's windows (calibrate(): the reads, and the bookkeeping between them) is not the
 * stage's: taken out of its wall time, and of a read call's CPU time.  The corrections are medians: a call's CPU
 * may come out a little below 0 or above its running time, and it is left so (clamping single calls would bias
 * the sums; the totals are bounded where they are reported). */
static void correct(CallMeasure *m) {
    m->wall -= g_wall_bias[m->read];
    if (m->wall < 0) m->wall = 0;
    if (m->susp > m->wall) m->susp = m->wall;
    if (m->loop > m->susp) m->loop = m->susp;
    if (!m->read || isnan(m->x[Q_CPU])) return;
    m->x[Q_CPU] -= (double)g_cpu_bias;
    if (m->have_ctr && g_ctr_taskclock >= 0 && !isnan(m->x[Q_CTR + g_ctr_taskclock]))
        m->x[Q_CTR + g_ctr_taskclock] = m->x[Q_CPU];
}

/* The call's part of each estimate of its node (and, in e, each quantity's per-call estimate for the parent). */
static inline void cell_add(Cell *c, double x, double w, double W) {
    c->n += 1, c->x += x, c->w += w, c->xx += x * x, c->xw += x * w, c->ww += w * w;
    c->Wn += W, c->Wx += W * x, c->Ww += W * w;
}

static void estimate_call(NodeStats *s, const Frame *f, const CallMeasure *m, double *e) {
    double run = (double)(m->wall - m->susp), child = (double)(f->child_wall - f->child_susp);
    s->covered++;
    s->cov_run += (int64_t)run;
    s->cov_run_self += (int64_t)(run - child);
    /* What predicts a call: its running time; a read call's timed between its CPU reads, less what an empty read
     * call has there (the whole reads' cost, taken out of its wall time, varies by µs; this varies far less). */
    if (m->read) run = fmax((double)(m->inner - m->susp - g_inner_bias), 0.0);
    double run_self = run - child;
    int nq = stats_quantities();
    /* A read call's stratum for its CPU time, run-queue time and counters is judged over its wall window, which
     * holds none of its reads (readings.h): its reads' own time would mark it as having left the CPU more often than
     * an unread call of the same work.  Its other quantities span the reads, and so does their stratum. */
    int b = stratum(run, m->switched_in), b_out = stratum(run, m->switched);
    s->run_b[b] += run;
    s->calls_b[b] += 1;
    s->cpu_pred += (1 - s->off_cpu[b]) * run;
    if (!m->read) {
        s->un[b] += 1;
        s->uw[b] += run;
        s->uws[b] += run_self;
        for (int q = 0; e && s->reads && q < nq; q++) e[q] = stats_predict(s, q, run, m->switched);
        return;
    }
    CellPair *in = NULL, *out = NULL;   /* the sums of the call's strata */
    if (stats_reserve(s, nq) < 0 || !(in = stats_cells(s, b)) || !(out = stats_cells(s, b_out))) {
        g_internal++;
        return;
    }
    double W = f->w;   /* 1 / p */
    for (int q = 0; q < nq; q++) {
        int inner = q == Q_CPU || q == Q_RQ || q >= Q_CTR;
        CellPair *t = inner ? &in[q] : &out[q];
        if (isnan(m->x[q])) {   /* not measured on this call: it counts as unread for this quantity */
            t->tot.un += 1, t->tot.uw += run, t->own.un += 1, t->own.uw += run_self;
            if (e) e[q] = stats_predict(s, q, run, inner ? m->switched_in : m->switched);
            continue;
        }
        cell_add(&t->tot, m->x[q], run, W);
        cell_add(&t->own, m->x[q] - f->rd->child[q], run_self, W);
        s->reads[q]++;
        if (e) e[q] = m->x[q];
    }
    const Cell *c = &in[Q_CPU].tot;
    if (!isnan(m->x[Q_CPU]) && c->w > 0) {   /* the stratum's share on a CPU, kept for the budget (O(1) a call) */
        double off = 1 - fmin(fmax(c->x / c->w, 0), 1);
        s->cpu_pred += (s->off_cpu[b] - off) * s->run_b[b];
        s->off_cpu[b] = off;
    }
}

static void record_wall(NodeStats *s, const Frame *f, const CallMeasure *m) {
    s->calls++;
    s->errors += m->error != 0;
    s->abandoned += m->abandoned != 0;
    s->overlapped += m->overlapped != 0;
    s->wall_total += m->wall;
    s->wall_self += m->wall - f->child_wall;   /* not clamped per call: the SDK's corrections of the parent and its
                                                  * children are medians, so totals add up exactly */
    if (m->wall < s->wall_min) s->wall_min = m->wall;
    if (m->wall > s->wall_max) s->wall_max = m->wall;
    if (hist_add(&s->h, (uint64_t)m->wall) < 0) g_internal++;
    s->susp_total += m->susp;
    s->susp_self += m->susp - f->child_susp;
    s->loop_total += m->loop;
    s->loop_self += m->loop - f->child_loop;
}

static void record_multiplexing(NodeStats *s, const CallMeasure *m) {
    CounterStat *c = stats_room(s->ctr, &s->n_ctr, g_ctr_n, sizeof(CounterStat));
    if (!c) { g_internal++; return; }
    s->ctr = c;
    for (int k = 0; k < g_ctr_n; k++) {
        if (isnan(m->x[Q_CTR + k])) continue;
        s->ctr[k].enabled += m->cen[k];
        s->ctr[k].running += m->crun[k];
        s->ctr[k].scaled += m->crun[k] != m->cen[k];
    }
}

void record_call(ThreadState *ts, const Frame *f, Frame *parent, CallMeasure *m) {
    if (!m->read) m->have_ctr = 0;
    correct(m);
    NodeStats *s = ts && f->epoch == g_epoch ? stats_get(&ts->stats, f->node) : NULL;   /* not a parent's, pre-fork */
    if (ts && f->epoch == g_epoch && !s) g_internal++;
    int covered = m->read || m->stand_in;
    double e[Q_MAX];
    int give = parent && parent->rd && covered;   /* a read parent's self needs its children's estimates */
    for (int q = 0; give && q < Q_MAX; q++) e[q] = m->read && !isnan(m->x[q]) ? m->x[q] : 0;
    if (s && !s->cpu0_set) stats_mark_start(s, m->wall);   /* its first call: it began at most its wall time ago */
    if (s && covered) estimate_call(s, f, m, give ? e : NULL);
    if (parent) {
        parent->child_wall += m->wall;
        parent->child_susp += m->susp;
        parent->child_loop += m->loop;
        for (int q = 0; give && q < stats_quantities(); q++) parent->rd->child[q] += e[q];
    }
    if (!s) return;
    record_wall(s, f, m);
    if (m->have_ctr) record_multiplexing(s, m);
    if (m->mem.have) {
        MemStat *x = stats_room(s->mem, &s->n_mem, mem_indices(), sizeof(MemStat));
        if (x) mem_stat_add(s->mem = x, &m->mem, f->w);   /* a measured call is a read one: w >= 1 */
        else g_internal++;
    }
    if (g_ring_cap && !m->abandoned)
        trace_add(f->node, (uint32_t)ts->native_id, f->t0, m->wall, m->read ? f->rd->r0.q[Q_CPU] : -1,
                  m->read && !isnan(m->x[Q_CPU]) ? (int64_t)(m->x[Q_CPU] > 0 ? m->x[Q_CPU] : 0) : -1);
}
