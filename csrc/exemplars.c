/* Exemplars of root stages: which stage a slow request lost its time in.
 *
 * A root stage's call (a frame whose node is a child of the root) takes an
 * ExemplarCall from a pool at its enter; every stage that closes in the same stack
 * (context) while it is open adds its self time to the call's breakdown, one
 * entry per node (a short linear search); at the root's exit the call is
 * offered to the root's store, which keeps the K slowest calls (a min-heap by
 * wall time) and a uniform reservoir of K calls (Algorithm R), then goes back to
 * the pool.  A store's slot arrays grow by doubling up to K and its slots keep
 * their breakdown buffers, so in the steady state nothing is allocated; stores
 * are made for at most EXEMPLAR_MAX_ROOTS root stages.  Stages in other contexts (tasks or threads the
 * request starts) are not in its breakdown; the time the request waits for them
 * is its own self time.  Everything runs with the GIL held. */
#include "exemplars.h"   /* first: Python.h sets the feature macros */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nodes.h"
#include "record.h"

#define EXEMPLAR_POOL_MAX 1024
#define EXEMPLAR_MAX_ROOTS 256          /* root stages with a store; calls of further ones are not kept */

typedef struct {
    uint64_t seq;                 /* the root frame's seq: identifies the call */
    int64_t wall, t0;
    uint32_t tid;
    int32_t n, cap;
    ExemplarPart *parts;
} Exemplar;

typedef struct {
    uint64_t seen;                /* calls offered */
    int32_t n_slow, n_res, cap;   /* cap: slots allocated in each array, grown by doubling up to g_exemplar_k */
    Exemplar *slow;                     /* a min-heap by wall */
    Exemplar *res;                      /* a uniform sample */
} ExemplarStore;

int32_t g_exemplar_k = 32;

static ExemplarStore **g_stores = NULL;   /* by root node id */
static int32_t g_n_stores = 0;
static uint32_t g_stores_gen = 0;   /* g_node_gen the node ids are of */
static size_t g_store_bytes = 0;
static int32_t g_n_roots = 0;       /* stores made */
static ExemplarCall *g_pool = NULL;
static int32_t g_pool_n = 0;
static size_t g_call_bytes = 0;     /* calls allocated, pooled or open */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {   /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

static int32_t parts_cap_for(int32_t n) {
    int32_t c = 4;
    while (c < n) c *= 2;
    return c < EXEMPLAR_MAX_PARTS ? c : EXEMPLAR_MAX_PARTS;
}

/* ------------------------------------------------------------ the calls */

static void call_free(ExemplarCall *c) {
    g_call_bytes -= sizeof(ExemplarCall) + (size_t)c->cap * sizeof(ExemplarPart);
    PyMem_Free(c->parts);
    PyMem_Free(c);
}

static void call_release(ExemplarCall *c) {
    if (g_pool_n >= EXEMPLAR_POOL_MAX) { call_free(c); return; }
    c->seq = 0;
    c->next = g_pool;
    g_pool = c;
    g_pool_n++;
}

static inline int64_t known_sum(int64_t a, int64_t b) { return a < 0 || b < 0 ? -1 : a + b; }

static void call_add(ExemplarCall *c, const ExemplarPart *x) {
    for (int32_t k = c->n - 1; k >= 0; k--) {
        ExemplarPart *p = &c->parts[k];
        if (p->node != x->node) continue;
        p->ns += x->ns, p->awaiting += x->awaiting, p->loop += x->loop;
        p->on_cpu = known_sum(p->on_cpu, x->on_cpu);
        p->runqueue = known_sum(p->runqueue, x->runqueue);
        p->gil = known_sum(p->gil, x->gil);
        if (x->mem > p->mem) p->mem = x->mem;   /* the largest of its calls' peaks (-1: none measured) */
        return;
    }
    if (c->n >= EXEMPLAR_MAX_PARTS - 1 && x->node != -1) {   /* full: the last slot adds up the rest */
        ExemplarPart rest = *x;
        rest.node = -1;
        call_add(c, &rest);
        return;
    }
    if (c->n == c->cap) {
        int32_t ncap = parts_cap_for(c->n + 1);
        ExemplarPart *p = PyMem_Realloc(c->parts, (size_t)ncap * sizeof(ExemplarPart));   /* under the GIL */
        if (!p) { g_internal++; return; }
        g_call_bytes += (size_t)(ncap - c->cap) * sizeof(ExemplarPart);
        c->parts = p;
        c->cap = ncap;
    }
    c->parts[c->n++] = *x;
}

void exemplar_enter(Stack *st, const Frame *f) {
    if (st->exemplar || g_nodes[f->node].parent != 0) return;
    ExemplarCall *c = g_pool;
    if (c) {
        g_pool = c->next;
        g_pool_n--;
    } else {
        if (!(c = PyMem_Calloc(1, sizeof(ExemplarCall)))) { g_internal++; return; }
        g_call_bytes += sizeof(ExemplarCall);
    }
    c->seq = f->seq;
    c->n = 0;
    c->next = NULL;
    st->exemplar = c;
}

void exemplar_stack_gone(Stack *st) {
    call_release(st->exemplar);
    st->exemplar = NULL;
}

/* ----------------------------------------------------------- the stores */

static void store_free(ExemplarStore *s) {
    for (int32_t k = 0; k < s->cap; k++) {
        free(s->slow[k].parts);
        free(s->res[k].parts);
    }
    free(s->slow);
    free(s->res);
    free(s);
}

void exemplar_reset(void) {
    while (g_pool) {   /* the calls not in use; those still open go back to the pool when they end */
        ExemplarCall *c = g_pool;
        g_pool = c->next;
        call_free(c);
    }
    g_pool_n = 0;
    for (int32_t i = 0; i < g_n_stores; i++) if (g_stores[i]) store_free(g_stores[i]);
    free(g_stores);
    g_stores = NULL;
    g_n_stores = 0;
    g_store_bytes = 0;
    g_n_roots = 0;
    g_stores_gen = g_node_gen;
}

int exemplar_set_k(int32_t k) {
    if (k < 0 || k > EXEMPLAR_MAX_K) return -1;
    if (k != g_exemplar_k) {
        exemplar_reset();
        g_exemplar_k = k;
    }
    return 0;
}

static ExemplarStore *store_get(int32_t node) {
    if (g_stores_gen != g_node_gen) exemplar_reset();
    if (node >= g_n_stores) {
        int32_t nn = g_n_stores ? g_n_stores : 16;
        while (nn <= node) nn *= 2;
        ExemplarStore **v = realloc(g_stores, (size_t)nn * sizeof(ExemplarStore *));
        if (!v) return NULL;
        memset(v + g_n_stores, 0, (size_t)(nn - g_n_stores) * sizeof(ExemplarStore *));
        g_store_bytes += (size_t)(nn - g_n_stores) * sizeof(ExemplarStore *);
        g_stores = v;
        g_n_stores = nn;
    }
    ExemplarStore *s = g_stores[node];
    if (!s) {
        if (g_n_roots >= EXEMPLAR_MAX_ROOTS) {
            warn_once("exemplar roots", "instrument: calls of more than %d top-level stages; the calls of further "
                      "ones are not kept as exemplars", EXEMPLAR_MAX_ROOTS);
            return NULL;
        }
        s = calloc(1, sizeof(ExemplarStore));
        if (!s) return NULL;
        g_store_bytes += sizeof(ExemplarStore);
        g_n_roots++;
        g_stores[node] = s;
    }
    return s;
}

/* Room for one more slot in both arrays (they grow together, doubling up to K). */
static int store_grow(ExemplarStore *s) {
    int32_t ncap = s->cap ? s->cap * 2 : 2;
    if (ncap > g_exemplar_k) ncap = g_exemplar_k;
    Exemplar *a = realloc(s->slow, (size_t)ncap * sizeof(Exemplar));
    if (!a) return -1;
    s->slow = a;
    Exemplar *b = realloc(s->res, (size_t)ncap * sizeof(Exemplar));
    if (!b) return -1;
    s->res = b;
    memset(a + s->cap, 0, (size_t)(ncap - s->cap) * sizeof(Exemplar));
    memset(b + s->cap, 0, (size_t)(ncap - s->cap) * sizeof(Exemplar));
    g_store_bytes += 2 * (size_t)(ncap - s->cap) * sizeof(Exemplar);
    s->cap = ncap;
    return 0;
}

static void exemplar_put(Exemplar *x, const ExemplarCall *c, int64_t wall, int64_t t0, uint32_t tid) {
    x->seq = c->seq;
    x->wall = wall;
    x->t0 = t0;
    x->tid = tid;
    if (x->cap < c->n) {
        int32_t ncap = parts_cap_for(c->n);
        ExemplarPart *p = realloc(x->parts, (size_t)ncap * sizeof(ExemplarPart));
        if (!p) { g_internal++; x->n = 0; return; }
        g_store_bytes += (size_t)(ncap - x->cap) * sizeof(ExemplarPart);
        x->parts = p;
        x->cap = ncap;
    }
    memcpy(x->parts, c->parts, (size_t)c->n * sizeof(ExemplarPart));
    x->n = c->n;
}

static void heap_swap(Exemplar *a, Exemplar *b) { Exemplar t = *a; *a = *b; *b = t; }

static void heap_up(Exemplar *h, int32_t i) {
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (h[p].wall <= h[i].wall) break;
        heap_swap(&h[p], &h[i]);
        i = p;
    }
}

static void heap_down(Exemplar *h, int32_t n) {
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l].wall < h[m].wall) m = l;
        if (r < n && h[r].wall < h[m].wall) m = r;
        if (m == i) break;
        heap_swap(&h[m], &h[i]);
        i = m;
    }
}

static void offer(int32_t root, const ExemplarCall *c, int64_t wall, int64_t t0, uint32_t tid) {
    ExemplarStore *s = store_get(root);
    if (!s) return;
    int32_t k = g_exemplar_k;
    if (s->n_slow == s->cap && s->cap < k && store_grow(s) < 0) { g_internal++; return; }
    s->seen++;
    if (s->n_slow < k) {
        exemplar_put(&s->slow[s->n_slow], c, wall, t0, tid);
        heap_up(s->slow, s->n_slow++);
    } else if (wall > s->slow[0].wall) {
        exemplar_put(&s->slow[0], c, wall, t0, tid);
        heap_down(s->slow, k);
    }
    if (s->n_res < k) {
        exemplar_put(&s->res[s->n_res++], c, wall, t0, tid);
    } else {
        uint64_t j = rng_next() % s->seen;
        if (j < (uint64_t)k) exemplar_put(&s->res[j], c, wall, t0, tid);
    }
}

static inline int64_t at_least_0(double x) { return x > 0 ? (int64_t)x : 0; }

void exemplar_exit(Stack *st, const Frame *f, const CallMeasure *m, ThreadState *ts) {
    ExemplarCall *c = st->exemplar;
    int64_t susp = m->susp - f->child_susp, loop = m->loop - f->child_loop;
    ExemplarPart x = {f->node, at_least_0((double)(m->wall - f->child_wall)), -1, -1, at_least_0((double)(susp - loop)),
                      at_least_0((double)loop), -1, -1};
    int h = m->mem.have && !m->mem.overlapped ? mem_host_index() : -1;   /* the source loop only for measured calls */
    if (h >= 0 && m->mem.peak[h] >= 0) x.mem = m->mem.peak[h];
    if (m->read && !isnan(m->x[Q_CPU])) x.on_cpu = at_least_0(m->x[Q_CPU] - f->rd->child[Q_CPU]);
    if (m->read && !isnan(m->x[Q_RQ])) x.runqueue = at_least_0(m->x[Q_RQ] - f->rd->child[Q_RQ]);
    if (m->read && x.on_cpu >= 0 && x.runqueue >= 0 && !isnan(m->x[Q_OFF]) && !isnan(m->x[Q_GIL])) {
        double off = m->x[Q_OFF] - f->rd->child[Q_OFF], gil = m->x[Q_GIL] - f->rd->child[Q_GIL];   /* samples */
        double blocked = (double)(x.ns - susp - x.on_cpu - x.runqueue);
        x.gil = off > 0 ? at_least_0(blocked * fmin(gil / off, 1.0)) : 0;
    }
    if (!m->read && g_switches && !m->switched) {   /* never left the CPU: on it for all its running time */
        x.on_cpu = at_least_0((double)(x.ns - susp));
        x.runqueue = 0;
    }
    call_add(c, &x);
    if (f->seq != c->seq) return;
    st->exemplar = NULL;   /* the root call ends */
    if (f->epoch == g_epoch && g_exemplar_k > 0) offer(f->node, c, m->wall, f->t0, ts ? (uint32_t)ts->native_id : 0);
    call_release(c);
}

/* ---------------------------------------------------------------- output */

static PyObject *exemplar_tuple(int32_t root, const Exemplar *x, int slow, int sample) {
    PyObject *parts = PyList_New(x->n);
    if (!parts) return NULL;
    for (int32_t k = 0; k < x->n; k++) {
        const ExemplarPart *p = &x->parts[k];
        PyObject *t = Py_BuildValue("(iLLLLLLL)", p->node, (long long)p->ns, (long long)p->on_cpu,
                                    (long long)p->runqueue, (long long)p->awaiting, (long long)p->loop,
                                    (long long)p->gil, (long long)p->mem);
        if (!t) { Py_DECREF(parts); return NULL; }
        PyList_SET_ITEM(parts, k, t);
    }
    return Py_BuildValue("(iKOOLLIN)", root, (unsigned long long)x->seq, slow ? Py_True : Py_False,
                         sample ? Py_True : Py_False, (long long)x->wall, (long long)x->t0, (unsigned int)x->tid, parts);
}

static int append(PyObject *l, PyObject *t) {
    if (!t) return -1;
    int r = PyList_Append(l, t);
    Py_DECREF(t);
    return r;
}

PyObject *exemplar_collect(void) {
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    if (g_stores_gen != g_node_gen) return l;
    for (int32_t root = 0; root < g_n_stores; root++) {
        ExemplarStore *s = g_stores[root];
        if (!s) continue;
        for (int32_t i = 0; i < s->n_slow; i++) {
            int sample = 0;
            for (int32_t j = 0; j < s->n_res && !sample; j++) sample = s->res[j].seq == s->slow[i].seq;
            if (append(l, exemplar_tuple(root, &s->slow[i], 1, sample)) < 0) { Py_DECREF(l); return NULL; }
        }
        for (int32_t j = 0; j < s->n_res; j++) {
            int slow = 0;
            for (int32_t i = 0; i < s->n_slow && !slow; i++) slow = s->res[j].seq == s->slow[i].seq;
            if (!slow && append(l, exemplar_tuple(root, &s->res[j], 0, 1)) < 0) { Py_DECREF(l); return NULL; }
        }
    }
    return l;
}

size_t exemplar_bytes(void) { return g_store_bytes; }
size_t exemplar_pool_bytes(void) { return g_call_bytes; }
