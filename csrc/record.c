/* Recording a finished call (record.h): the reads' own cost taken out, the
 * parent frame's child sums, and the node's slot on the recording thread. */
#include "record.h"   /* first: Python.h sets the feature macros */

#include <stdlib.h>

#include "hist.h"
#include "stats.h"

void counter_deltas(const perf_reading *c0, const perf_reading *c1, CallMeasure *m) {
    m->have_ctr = 1;
    for (int k = 0; k < g_ctr_n; k++) {
        uint64_t dv = c1->value[k] - c0->value[k];
        uint64_t en = c1->enabled[k] - c0->enabled[k], run = c1->running[k] - c0->running[k];
        m->cen[k] = en;
        m->crun[k] = run;
        /* multiplexed: scale by enabled/running; never ran: no value (not 0) */
        m->cval[k] = run == 0 ? -1.0 : run == en ? (double)dv : (double)dv * ((double)en / (double)run);
    }
}

/* The SDK's own work inside a call's windows (calibrate(): the reads, and the bookkeeping between them) is not the
 * stage's: taken out of its wall and CPU time; a call on one thread cannot use more CPU than its wall time;
 * system time is not measured across a suspension (other tasks' kernel time would be in it). */
static void correct(const Frame *f, CallMeasure *m) {
    m->wall -= g_wall_bias[m->read];
    if (m->wall < 0) m->wall = 0;
    if (m->cpu >= 0) {
        m->cpu -= g_cpu_bias[f->cpu_src];
        if (g_cpu_clamp && m->cpu < 0) m->cpu = 0;
        if (g_cpu_clamp && m->cpu > m->wall) m->cpu = m->wall;
        if (f->cpu_src == 2 && m->have_ctr && m->cval[g_ctr_taskclock] >= 0) m->cval[g_ctr_taskclock] = (double)m->cpu;
    } else {
        m->cpu = -1;
    }
    if (m->sys >= 0 && (m->cpu < 0 || m->susp)) m->sys = -1;
    if (m->sys > m->cpu) m->sys = m->cpu;
}

static void charge_parent(Frame *p, const Frame *f, const CallMeasure *m) {
    double w = f->w;
    p->child_wall += m->wall;
    p->child_susp += m->susp;
    if (w != 1.0) p->child_est = 1;
    if (m->cpu >= 0) p->child_cpu += (int64_t)((double)m->cpu * w + 0.5);
    if (m->sys >= 0) p->child_sys += (int64_t)((double)m->sys * w + 0.5);
    if (m->have_ctr && p->ctr_gen == f->ctr_gen)
        for (int k = 0; k < g_ctr_n; k++) if (m->cval[k] >= 0) p->child_c[k] += m->cval[k] * w;
}

static inline int64_t weighted(int64_t x, double w) { return (int64_t)((double)x * w + (x < 0 ? -0.5 : 0.5)); }

static void record_wall(NodeStats *s, const Frame *f, const CallMeasure *m) {
    s->calls++;
    s->errors += m->error != 0;
    s->abandoned += m->abandoned != 0;
    s->wall_total += m->wall;
    s->wall_self += m->wall - f->child_wall;   /* not clamped per call: the SDK's corrections of the parent and its
                                                  * children are medians, so totals add up exactly */
    if (m->wall < s->wall_min) s->wall_min = m->wall;
    if (m->wall > s->wall_max) s->wall_max = m->wall;
    if (hist_add(&s->h, (uint64_t)m->wall) < 0) g_internal++;
    s->overlapped += m->overlapped != 0;
    s->susp_total += m->susp;
    int64_t susp_self = m->susp - f->child_susp;
    s->susp_self += susp_self > 0 ? susp_self : 0;
}

/* Whether the thread has a CPU source an unread call's CPU time could have come from. */
static int cpu_source_open(const ThreadState *ts) {
    return (g_ctr_taskclock >= 0 && ts->perf_gen == g_ctr_gen && ts->perf.fd[g_ctr_taskclock] >= 0) || g_cpu_clock;
}

static void record_cpu(NodeStats *s, const Frame *f, const CallMeasure *m, const ThreadState *ts) {
    double w = f->w;
    if (m->cpu < 0) {
        if (m->stand_in && cpu_source_open(ts)) {   /* the read calls stand for it */
            s->cpu_calls++;
            s->cpu_cov_wall += m->wall;
        }
        return;
    }
    s->cpu_calls++;
    s->cpu_reads++;
    s->cpu_wsum += w;
    s->cpu_wall_w += (double)m->wall * w;
    s->cpu_cov_wall += m->wall;
    s->cpu_total += weighted(m->cpu, w);
    int64_t self_cpu = m->cpu - f->child_cpu;
    if (self_cpu < 0 && !f->child_est) self_cpu = 0;   /* estimates of children may exceed it */
    s->cpu_self += weighted(self_cpu, w);
    if (m->sys < 0) return;
    int64_t self_sys = m->sys - f->child_sys;
    if (self_sys < 0 && !f->child_est) self_sys = 0;
    s->sys_reads++;
    s->sys_total += weighted(m->sys, w);
    s->sys_self += weighted(self_sys, w);
    s->sys_cpu_total += weighted(m->cpu, w);
    s->sys_cpu_self += weighted(self_cpu, w);
}

static void record_counters(NodeStats *s, const Frame *f, const CallMeasure *m, const ThreadState *ts) {
    int stand_in = !m->have_ctr && m->stand_in && g_ctr_n && ts->perf_gen == g_ctr_gen;
    if (!m->have_ctr && !stand_in) return;
    if (!s->ctr && !(s->ctr = calloc(PERF_MAX_EVENTS, sizeof(CounterStat)))) { g_internal++; return; }
    if (stand_in) {   /* the read calls stand for it, for every counter that is open */
        for (int k = 0; k < g_ctr_n; k++) if (ts->perf.fd[k] >= 0) s->ctr[k].covered++;
        return;
    }
    double w = f->w;
    for (int k = 0; k < g_ctr_n; k++) {
        if (m->cval[k] < 0) continue;
        CounterStat *c = &s->ctr[k];
        c->total += m->cval[k] * w;
        double self_c = m->cval[k] - f->child_c[k];
        if (self_c < 0 && !f->child_est) self_c = 0;
        c->self += self_c * w;
        c->enabled += m->cen[k];
        c->running += m->crun[k];
        c->counted++;
        c->covered++;
        c->wsum += w;
        c->scaled += m->crun[k] != m->cen[k];
    }
}

void record_call(ThreadState *ts, const Frame *f, Frame *parent, CallMeasure *m) {
    correct(f, m);
    if (parent) charge_parent(parent, f, m);
    if (!ts || f->epoch != g_epoch) return;   /* no slots on this thread; opened before a fork: the parent's call */
    NodeStats *s = stats_get(&ts->stats, f->node);
    if (!s) { g_internal++; return; }
    record_wall(s, f, m);
    record_cpu(s, f, m, ts);
    record_counters(s, f, m, ts);
    if (g_ring_cap && !m->abandoned)
        trace_add(f->node, (uint32_t)ts->native_id, f->t0, m->wall, m->cpu >= 0 ? f->cpu0 : -1, m->cpu);
}
