/* perf_event counter sets for the calling thread: open/read/close, the mmap-page
 * self-read protocol, and the CounterGroup Python type used by tests and doctor. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "perf.h"

#define READ_FORMAT (PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | \
                     PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID)
#define barrier() __asm__ __volatile__("" ::: "memory")
#define SEQ_RETRIES 64 /* a page whose lock never settles is treated as unreadable */

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_RDPMC 1
static uint64_t hw_rdpmc(uint32_t counter, void *ctx)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdpmc" : "=a"(lo), "=d"(hi) : "c"(counter));
    return lo | (uint64_t)hi << 32;
}
static inline uint64_t hw_rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return lo | (uint64_t)hi << 32;
}
#else
#define HAVE_RDPMC 0
#endif

/* ---------------------------------------------------------------- mmap page */

static inline uint64_t sign_extend(uint64_t v, unsigned width)
{
    if (width == 0 || width >= 64)
        return v;
    unsigned sh = 64 - width;
    return (uint64_t)((int64_t)(v << sh) >> sh);
}

static inline uint64_t mul_u64_u32_shr(uint64_t a, uint32_t mul, unsigned shift)
{
    if (shift >= 64) /* never from a kernel (shift <= 32); keeps a crafted page defined */
        return 0;
#ifdef __SIZEOF_INT128__
    __extension__ typedef unsigned __int128 u128;
    return (uint64_t)(((u128)a * mul) >> shift);
#else
    uint64_t lo = (uint64_t)(uint32_t)a * mul, mid = (lo >> 32) + (a >> 32) * mul; /* mid = a*mul >> 32, cannot overflow */
    return shift >= 32 ? mid >> (shift - 32) : (mid << (32 - shift)) | ((uint32_t)lo >> shift);
#endif
}

int perf_mmap_read_self(const volatile struct perf_event_mmap_page *pc,
                        uint64_t (*rdpmc_fn)(uint32_t counter, void *ctx), void *ctx,
                        uint64_t now_tsc, uint64_t *value, uint64_t *enabled, uint64_t *running)
{
    uint32_t seq, idx, mult = 0;
    unsigned shift = 0;
    uint64_t cnt, ena, run, toff = 0, tcyc = 0, tmask = ~0ULL;
    int user_time, tries = 0;

    if (!pc)
        return -1;
    do {
        if (++tries > SEQ_RETRIES)
            return -1;
        seq = pc->lock;
        barrier();
        ena = pc->time_enabled;
        run = pc->time_running;
        user_time = pc->cap_user_time;
        if (user_time) {
            mult = pc->time_mult;
            shift = pc->time_shift;
            toff = pc->time_offset;
            if (pc->cap_user_time_short) {
                tcyc = pc->time_cycles;
                tmask = pc->time_mask;
            }
        }
        idx = pc->index;
        if (!pc->cap_user_rdpmc || !idx)
            return -1;
        cnt = (uint64_t)pc->offset + sign_extend(rdpmc_fn(idx - 1, ctx), pc->pmc_width);
        barrier();
    } while (pc->lock != seq);

    /* libperf extrapolates only when multiplexed because it scales right away; the
     * readings here are raw and cumulative, so the times must advance even when equal. */
    if (user_time) {
        uint64_t cyc = tcyc + ((now_tsc - tcyc) & tmask); /* cap_user_time_short wrap; no-op otherwise */
        uint64_t delta = toff + mul_u64_u32_shr(cyc, mult, shift);
        ena += delta;
        run += delta;
    }
    *value = cnt;
    *enabled = ena;
    *running = run;
    return 0;
}

int perf_mmap_time_self(const volatile struct perf_event_mmap_page *pc, uint64_t now_tsc, uint64_t *ns)
{
    uint32_t seq, mult;
    unsigned shift;
    uint64_t ena, toff, tcyc = 0, tmask = ~0ULL;
    int tries = 0;

    if (!pc)
        return -1;
    do {
        if (++tries > SEQ_RETRIES)
            return -1;
        seq = pc->lock;
        barrier();
        if (!pc->cap_user_time)
            return -1;
        ena = pc->time_enabled;
        mult = pc->time_mult;
        shift = pc->time_shift;
        toff = pc->time_offset;
        if (pc->cap_user_time_short) {
            tcyc = pc->time_cycles;
            tmask = pc->time_mask;
        }
        barrier();
    } while (pc->lock != seq);
    uint64_t cyc = tcyc + ((now_tsc - tcyc) & tmask);
    *ns = ena + toff + mul_u64_u32_shr(cyc, mult, shift);
    return 0;
}

/* ---------------------------------------------------------------- open */

static int event_class(uint32_t type)
{
    switch (type) {
    case PERF_TYPE_HARDWARE: case PERF_TYPE_HW_CACHE: case PERF_TYPE_RAW: return 0;
    case PERF_TYPE_SOFTWARE: return 1;
    default: return 2 + (int)type; /* other PMUs only group with their own kind */
    }
}

static int sys_open(const perf_event_desc *d, int group_fd, int exclude_kernel)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a); /* inherit=0: this thread only */
    /* a leader starts disabled and is enabled once its members are attached: members
     * joining a running group count nothing until the thread is next scheduled in */
    a.disabled = group_fd < 0;
    a.type = d->type;
    a.size = sizeof a;
    a.config = d->config;
    a.read_format = READ_FORMAT;
    a.exclude_kernel = a.exclude_hv = exclude_kernel ? 1 : 0;
    long fd = syscall(SYS_perf_event_open, &a, 0, -1, group_fd, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}

static void reset(perf_set *s)
{
    for (int i = 0; i < PERF_MAX_EVENTS; i++) {
        s->fd[i] = -1;
        s->page[i] = NULL;
    }
    for (int g = 0; g < PERF_MAX_GROUPS; g++)
        s->group[g].leader_fd = -1;
    s->ngroups = 0;
    s->rdpmc = 0;
}

/* One pass over the events; returns the count opened, or -1 when kernel counting
 * was refused and the caller should retry user-only. */
static int open_pass(perf_set *s, int exclude_kernel)
{
    int opened = 0;
    for (int i = 0; i < s->n; i++) {
        int cls = event_class(s->ev[i].type), fd = -1, err = 0, gi = -1;
        for (int g = 0; g < s->ngroups && fd < 0; g++) { /* fewest groups: join any of its class */
            if (s->group[g].cls != cls)
                continue;
            fd = sys_open(&s->ev[i], s->group[g].leader_fd, exclude_kernel);
            if (fd >= 0)
                gi = g;
            else
                err = -fd;
        }
        if (fd < 0 && s->ngroups < PERF_MAX_GROUPS) {
            fd = sys_open(&s->ev[i], -1, exclude_kernel);
            if (fd >= 0) {
                gi = s->ngroups++;
                s->group[gi] = (perf_group){.leader_fd = fd, .cls = cls};
            } else {
                err = -fd;
            }
        }
        if (fd < 0) {
            s->status[i] = err ? err : ENOSPC;
            if (!exclude_kernel && (err == EACCES || err == EPERM))
                return -1;
            continue;
        }
        perf_group *g = &s->group[gi];
        uint64_t id = 0;
        if (ioctl(fd, PERF_EVENT_IOC_ID, &id) < 0)
            id = 0; /* kernels before 3.12: read order still matches open order */
        g->idx[g->nr] = i;
        g->id[g->nr++] = id;
        s->fd[i] = fd;
        s->status[i] = 0;
        opened++;
    }
    return opened;
}

static void map_pages(perf_set *s)
{
#if HAVE_RDPMC
    long pagesz = sysconf(_SC_PAGESIZE);
    for (int gi = 0; gi < s->ngroups; gi++) {
        perf_group *g = &s->group[gi];
        if (g->cls != 0)
            continue;
        int ok = 1;
        for (int j = 0; j < g->nr && ok; j++) {
            int k = g->idx[j];
            void *p = mmap(NULL, (size_t)pagesz, PROT_READ, MAP_SHARED, s->fd[k], 0);
            if (p == MAP_FAILED)
                break;
            s->page[k] = p;
            ok = s->page[k]->cap_user_rdpmc;
        }
        for (int j = 0; j < g->nr && ok; j++)
            ok = s->page[g->idx[j]] != NULL;
        if (!ok) {
            for (int j = 0; j < g->nr; j++) {
                int k = g->idx[j];
                if (s->page[k])
                    munmap(s->page[k], (size_t)pagesz);
                s->page[k] = NULL;
            }
        }
        g->rdpmc = ok;
        s->rdpmc |= ok;
    }
#endif
}

int perf_set_open(perf_set *s, const perf_event_desc *ev, int n, int exclude_kernel)
{
    memset(s, 0, sizeof *s);
    reset(s);
    s->owner = pthread_self();
    if (n < 0 || n > PERF_MAX_EVENTS || (n && !ev)) {
        errno = EINVAL;
        return -1;
    }
    s->n = n;
    memcpy(s->ev, ev, (size_t)n * sizeof *ev);
    s->exclude_kernel = exclude_kernel ? 1 : 0;
    int opened = open_pass(s, s->exclude_kernel);
    if (opened < 0) { /* as perf does: kernel counting refused, count user space only */
        perf_set_close(s);
        memset(s->status, 0, sizeof s->status);
        s->exclude_kernel = 1;
        opened = open_pass(s, 1);
    }
    for (int g = 0; g < s->ngroups; g++)
        ioctl(s->group[g].leader_fd, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP);
    map_pages(s);
    return opened;
}

void perf_set_close(perf_set *s)
{
    long pagesz = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < PERF_MAX_EVENTS; i++) {
        if (s->page[i])
            munmap(s->page[i], (size_t)pagesz);
        if (s->fd[i] >= 0)
            close(s->fd[i]);
    }
    reset(s);
}

int perf_set_uses_rdpmc(const perf_set *s) { return s->rdpmc; }

/* One software event of the calling thread, enabled, with its mmap page: 0, or -1 with nothing kept open. */
static int page_open(perf_clock *c, uint64_t config)
{
    c->fd = -1;
    c->page = NULL;
    c->user_time = 0;
    perf_event_desc d = {PERF_TYPE_SOFTWARE, config};
    int fd = sys_open(&d, -1, 0);
    if (fd < 0)
        fd = sys_open(&d, -1, 1);
    if (fd < 0)
        return -1;
    long pagesz = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, (size_t)pagesz, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) < 0) {   /* opened disabled, as a leader */
        if (p != MAP_FAILED)
            munmap(p, (size_t)pagesz);
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->page = p;
    return 0;
}

int perf_clock_open(perf_clock *c)
{
    if (page_open(c, PERF_COUNT_SW_TASK_CLOCK) < 0)
        return -1;
    c->user_time = 0;
#if HAVE_RDPMC
    uint64_t ns;
    c->user_time = perf_mmap_time_self(c->page, hw_rdtsc(), &ns) == 0;
#endif
    return 0;
}

int perf_switch_open(perf_clock *c)
{
    return page_open(c, PERF_COUNT_SW_CONTEXT_SWITCHES);
}

int64_t perf_clock_read(perf_clock *c)
{
#if HAVE_RDPMC
    uint64_t ns;
    if (c->user_time && perf_mmap_time_self(c->page, hw_rdtsc(), &ns) == 0)
        return (int64_t)ns;
#endif
    uint64_t v[5];   /* READ_FORMAT of a lone leader: nr, time enabled, time running, {value, id} */
    if (c->fd < 0 || read(c->fd, v, sizeof v) < (ssize_t)(4 * sizeof(uint64_t)))
        return -1;
    return (int64_t)v[3];
}

void perf_clock_close(perf_clock *c)
{
    if (c->page)
        munmap(c->page, (size_t)sysconf(_SC_PAGESIZE));
    if (c->fd >= 0)
        close(c->fd);
    c->page = NULL;
    c->fd = -1;
}

/* ---------------------------------------------------------------- read */

static void zero_group(const perf_group *g, perf_reading *r)
{
    for (int j = 0; j < g->nr; j++) {
        int k = g->idx[j];
        r->value[k] = r->enabled[k] = r->running[k] = 0;
    }
}

static int read_group(const perf_group *g, perf_reading *r)
{
    uint64_t buf[3 + 2 * PERF_MAX_EVENTS];
    ssize_t got;
    do
        got = read(g->leader_fd, buf, (3 + 2 * (size_t)g->nr) * sizeof(uint64_t));
    while (got < 0 && errno == EINTR);
    zero_group(g, r);
    if (got < (ssize_t)(3 * sizeof(uint64_t))) {
        if (got >= 0)
            errno = EIO;
        return -1;
    }
    uint64_t nr = buf[0], avail = ((uint64_t)got / sizeof(uint64_t) - 3) / 2;
    if (nr > avail)
        nr = avail;
    for (uint64_t j = 0; j < nr; j++) {
        uint64_t id = buf[4 + 2 * j];
        int m = (j < (uint64_t)g->nr && (g->id[j] == id || !g->id[j])) ? (int)j : -1; /* id 0: no IOC_ID */
        for (int q = 0; m < 0 && q < g->nr; q++) /* order differs only if the kernel changes it */
            if (g->id[q] == id)
                m = q;
        if (m < 0)
            continue;
        int k = g->idx[m];
        r->value[k] = buf[3 + 2 * j];
        r->enabled[k] = buf[1];
        r->running[k] = buf[2];
    }
    return 0;
}

#if HAVE_RDPMC
static int read_group_rdpmc(const perf_set *s, const perf_group *g, perf_reading *r)
{
    for (int j = 0; j < g->nr; j++) {
        int k = g->idx[j];
        if (perf_mmap_read_self(s->page[k], hw_rdpmc, NULL, hw_rdtsc(),
                                &r->value[k], &r->enabled[k], &r->running[k]) < 0)
            return -1;
    }
    return 0;
}
#endif

int perf_set_read(perf_set *s, perf_reading *r)
{
    int rc = 0;
    for (int i = 0; i < s->n; i++)
        if (s->fd[i] < 0)
            r->value[i] = r->enabled[i] = r->running[i] = 0;
#if HAVE_RDPMC
    /* rdpmc reads the current CPU's counter: only the opening thread may use it */
    int self = s->rdpmc && pthread_equal(pthread_self(), s->owner);
#endif
    for (int gi = 0; gi < s->ngroups; gi++) {
        const perf_group *g = &s->group[gi];
#if HAVE_RDPMC
        if (self && g->rdpmc && read_group_rdpmc(s, g, r) == 0)
            continue;
#endif
        if (read_group(g, r) < 0)
            rc = -1;
    }
    return rc;
}

/* ---------------------------------------------------------------- Python */

typedef struct {
    PyObject_HEAD
    perf_set set;
    int closed;
} CounterGroupObject;

static int parse_events(PyObject *events, perf_event_desc *out, int *n)
{
    PyObject *seq = PySequence_Fast(events, "events must be a sequence of (type, config) pairs");
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > PERF_MAX_EVENTS) {
        PyErr_Format(PyExc_ValueError, "at most %d events per CounterGroup, got %zd", PERF_MAX_EVENTS, len);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "event must be a (type, config) pair");
        if (!pair)
            goto fail;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_ValueError, "event must be a (type, config) pair");
            goto fail;
        }
        unsigned long type = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(pair, 0));
        unsigned long long config = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        if (PyErr_Occurred())
            goto fail;
        if (type > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "event type does not fit in 32 bits");
            goto fail;
        }
        out[i] = (perf_event_desc){.type = (uint32_t)type, .config = config};
    }
    *n = (int)len;
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *cg_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"events", "exclude_kernel", NULL};
    PyObject *events;
    int exclude_kernel = 1, n = 0;
    perf_event_desc ev[PERF_MAX_EVENTS];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:CounterGroup", kwlist, &events, &exclude_kernel))
        return NULL;
    if (parse_events(events, ev, &n) < 0)
        return NULL;
    CounterGroupObject *self = (CounterGroupObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    perf_set_open(&self->set, ev, n, exclude_kernel);
    return (PyObject *)self;
}

static void cg_dealloc(CounterGroupObject *self)
{
    perf_set_close(&self->set);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cg_read(CounterGroupObject *self, PyObject *unused)
{
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "read of a closed CounterGroup");
        return NULL;
    }
    perf_reading r;
    if (perf_set_read(&self->set, &r) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *out = PyList_New(self->set.n);
    for (int i = 0; out && i < self->set.n; i++) {
        PyObject *t = PyTuple_New(3), *v = PyLong_FromUnsignedLongLong(r.value[i]),
                 *e = PyLong_FromUnsignedLongLong(r.enabled[i]), *u = PyLong_FromUnsignedLongLong(r.running[i]);
        if (!t || !v || !e || !u) {
            Py_XDECREF(t), Py_XDECREF(v), Py_XDECREF(e), Py_XDECREF(u);
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(t, 0, v), PyTuple_SET_ITEM(t, 1, e), PyTuple_SET_ITEM(t, 2, u);
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyObject *cg_close(CounterGroupObject *self, PyObject *unused)
{
    perf_set_close(&self->set);
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *cg_enter(PyObject *self, PyObject *unused)
{
    Py_INCREF(self);
    return self;
}

static PyObject *cg_exit(CounterGroupObject *self, PyObject *args)
{
    perf_set_close(&self->set);
    self->closed = 1;
    Py_RETURN_FALSE;
}

static PyObject *cg_status(CounterGroupObject *self, void *unused)
{
    PyObject *out = PyList_New(self->set.n);
    for (int i = 0; out && i < self->set.n; i++) {
        PyObject *v = PyLong_FromLong(self->set.status[i]);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *cg_rdpmc(CounterGroupObject *self, void *unused) { return PyBool_FromLong(perf_set_uses_rdpmc(&self->set)); }
static PyObject *cg_exclude_kernel(CounterGroupObject *self, void *unused) { return PyBool_FromLong(self->set.exclude_kernel); }
static PyObject *cg_closed(CounterGroupObject *self, void *unused) { return PyBool_FromLong(self->closed); }
static PyObject *cg_groups(CounterGroupObject *self, void *unused) { return PyLong_FromLong(self->set.ngroups); }

static PyMethodDef cg_methods[] = {
    {"read", (PyCFunction)cg_read, METH_NOARGS, "read() -> list of (value, enabled, running), raw and cumulative"},
    {"close", (PyCFunction)cg_close, METH_NOARGS, "close the perf_event fds"},
    {"__enter__", cg_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)cg_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef cg_getset[] = {
    {"status", (getter)cg_status, NULL, "errno per event, 0 = open", NULL},
    {"rdpmc", (getter)cg_rdpmc, NULL, "whether some group is read with rdpmc", NULL},
    {"exclude_kernel", (getter)cg_exclude_kernel, NULL, "whether kernel counting was excluded (after fallback)", NULL},
    {"closed", (getter)cg_closed, NULL, NULL, NULL},
    {"groups", (getter)cg_groups, NULL, "number of perf_event groups (one read each)", NULL},
    {NULL},
};

static PyTypeObject CounterGroupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native.CounterGroup",
    .tp_basicsize = sizeof(CounterGroupObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CounterGroup(events: list[tuple[int, int]], exclude_kernel: bool = True)\n\n"
              "perf_event counters of the calling thread, grouped; read() returns raw\n"
              "cumulative (value, enabled, running) per event, zeros for events not open.",
    .tp_new = cg_new,
    .tp_dealloc = (destructor)cg_dealloc,
    .tp_methods = cg_methods,
    .tp_getset = cg_getset,
};

typedef struct { uint64_t value; uint32_t counter; int called; } fake_pmc;

static uint64_t fake_rdpmc(uint32_t counter, void *ctx)
{
    fake_pmc *f = ctx;
    f->counter = counter;
    f->called = 1;
    return f->value;
}

/* The test hooks' page: an aligned copy of crafted bytes; 0, or -1 with ValueError when too short. */
static int page_from_bytes(const char *data, Py_ssize_t len, struct perf_event_mmap_page *page)
{
    if ((size_t)len < offsetof(struct perf_event_mmap_page, __reserved)) {
        PyErr_Format(PyExc_ValueError, "page must hold at least %zu bytes",
                     offsetof(struct perf_event_mmap_page, __reserved));
        return -1;
    }
    memset(page, 0, sizeof *page);
    memcpy(page, data, (size_t)len < sizeof *page ? (size_t)len : sizeof *page);
    return 0;
}

static PyObject *perf_mmap_decode(PyObject *mod, PyObject *args)
{
    const char *data;
    Py_ssize_t len;
    unsigned long long pmc, tsc;
    struct perf_event_mmap_page page;
    if (!PyArg_ParseTuple(args, "y#KK:_perf_mmap_decode", &data, &len, &pmc, &tsc) ||
        page_from_bytes(data, len, &page) < 0)
        return NULL;
    fake_pmc f = {.value = pmc};
    uint64_t v, e, r;
    if (perf_mmap_read_self(&page, fake_rdpmc, &f, tsc, &v, &e, &r) < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KKKI)", (unsigned long long)v, (unsigned long long)e,
                         (unsigned long long)r, (unsigned int)f.counter);
}

static PyObject *perf_mmap_time_decode(PyObject *mod, PyObject *args)
{
    const char *data;
    Py_ssize_t len;
    unsigned long long tsc;
    struct perf_event_mmap_page page;
    if (!PyArg_ParseTuple(args, "y#K:_perf_mmap_time_decode", &data, &len, &tsc) ||
        page_from_bytes(data, len, &page) < 0)
        return NULL;
    uint64_t ns;
    if (perf_mmap_time_self(&page, tsc, &ns) < 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(ns);
}

static PyMethodDef perf_functions[] = {
    {"_perf_mmap_time_decode", perf_mmap_time_decode, METH_VARARGS,
     "_perf_mmap_time_decode(page: bytes, now_tsc: int) -> int | None\n\nTest hook: perf_mmap_time_self on a "
     "crafted page (the thread CPU time a task-clock page gives without a system call)."},
    {"_perf_mmap_decode", perf_mmap_decode, METH_VARARGS,
     "_perf_mmap_decode(page: bytes, rdpmc_value: int, now_tsc: int) -> (value, enabled, running, "
     "rdpmc_counter) | None\n\nTest hook: perf_mmap_read_self on a crafted page with rdpmc returning rdpmc_value."},
    {NULL},
};

int perf_add_types(PyObject *module)
{
    if (PyType_Ready(&CounterGroupType) < 0)
        return -1;
    Py_INCREF(&CounterGroupType);
    if (PyModule_AddObject(module, "CounterGroup", (PyObject *)&CounterGroupType) < 0) {
        Py_DECREF(&CounterGroupType);
        return -1;
    }
    return PyModule_AddFunctions(module, perf_functions);
}
