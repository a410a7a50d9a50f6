/* NVTX emission primitives and their Python bindings (see nvtx_emit.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first: it sets the feature macros the NVTX loader needs */
#include <string.h>

#include "nvtx_emit.h"

/* Kelly's 22 colours of maximum contrast without white and black, as opaque ARGB.
 * Must stay identical to instrument/nvtx.py:_PALETTE. */
static const uint32_t palette[20] = {
    0xFFF3C300, 0xFF875692, 0xFFF38400, 0xFFA1CAF1, 0xFFBE0032, 0xFFC2B280, 0xFF848482,
    0xFF008856, 0xFFE68FAC, 0xFF0067A5, 0xFFF99379, 0xFF604E97, 0xFFF6A600, 0xFFB3446C,
    0xFFDCD300, 0xFF882D17, 0xFF8DB600, 0xFF654522, 0xFFE25822, 0xFF2B3D26,
};

uint32_t nvtx_emit_color(const char *name, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a 32 */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 16777619u;
    }
    h ^= h >> 16; /* FNV-1a's low bits only see the bytes' low bits: fold before the modulo */
    return palette[h % (sizeof palette / sizeof palette[0])];
}

static char domain_name[256];
static uint32_t generation;

uint32_t nvtx_emit_generation(void) { return generation; }
const char *nvtx_emit_domain_name(void) { return domain_name; }

#ifdef INSTRUMENT_HAVE_NVTX
#define NVTX_AS_SYSTEM_HEADER /* keep -Wall -Wextra quiet about the vendored header */
#include <nvtx3/nvToolsExt.h>

static nvtxDomainHandle_t domain;

int nvtx_emit_available(void) { return 1; }

int nvtx_emit_init(const char *name)
{
    if (!name || !*name) name = NVTX_EMIT_DEFAULT_DOMAIN;
    if (generation && strncmp(name, domain_name, sizeof domain_name) == 0) return 0;
    snprintf(domain_name, sizeof domain_name, "%s", name);
    domain = nvtxDomainCreateA(domain_name); /* NULL without a tool: every later call is a no-op */
    generation++;
    return 0;
}

static inline void ensure_domain(void)
{
    if (!generation) nvtx_emit_init(NVTX_EMIT_DEFAULT_DOMAIN);
}

int nvtx_emit_active(void)
{
    ensure_domain();
    return domain != NULL;
}

void *nvtx_emit_register(const char *message)
{
    ensure_domain();
    return (void *)nvtxDomainRegisterStringA(domain, message);
}

void nvtx_emit_name_category(uint32_t category, const char *name)
{
    ensure_domain();
    nvtxDomainNameCategoryA(domain, category, name);
}

#define EVENT_ATTRIBUTES(a, registered, color, category)        \
    nvtxEventAttributes_t a;                                    \
    memset(&a, 0, sizeof a);                                    \
    a.version = NVTX_VERSION;                                   \
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;                     \
    a.category = (category);                                    \
    a.colorType = NVTX_COLOR_ARGB;                              \
    a.color = (color);                                          \
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;               \
    a.message.registered = (nvtxStringHandle_t)(registered)

void nvtx_emit_push(void *registered, uint32_t color, uint32_t category)
{
    EVENT_ATTRIBUTES(a, registered, color, category);
    nvtxDomainRangePushEx(domain, &a);
}

void nvtx_emit_pop(void) { nvtxDomainRangePop(domain); }

uint64_t nvtx_emit_start(void *registered, uint32_t color, uint32_t category)
{
    EVENT_ATTRIBUTES(a, registered, color, category);
    return nvtxDomainRangeStartEx(domain, &a);
}

void nvtx_emit_end(uint64_t id) { nvtxDomainRangeEnd(domain, id); }

#else /* built without the NVTX headers: same API, nothing emitted */

int nvtx_emit_available(void) { return 0; }
int nvtx_emit_active(void) { return 0; }
int nvtx_emit_init(const char *name)
{
    if (!name || !*name) name = NVTX_EMIT_DEFAULT_DOMAIN;
    if (!generation || strncmp(name, domain_name, sizeof domain_name) != 0) {
        snprintf(domain_name, sizeof domain_name, "%s", name);
        generation++;
    }
    return 0;
}
void *nvtx_emit_register(const char *message) { return NULL; }
void nvtx_emit_name_category(uint32_t category, const char *name) {}
void nvtx_emit_push(void *registered, uint32_t color, uint32_t category) {}
void nvtx_emit_pop(void) {}
uint64_t nvtx_emit_start(void *registered, uint32_t color, uint32_t category) { return 0; }
void nvtx_emit_end(uint64_t id) {}

#endif

/* ---- Python bindings ------------------------------------------------------------ */

typedef struct { void *handle; uint32_t color; } entry_t;

static PyObject *cache; /* str -> bytes(entry_t): one registration and one hash per name */

static int lookup(PyObject *name, entry_t *e)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "name must be str, not %.100s", Py_TYPE(name)->tp_name);
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(cache, name);
    if (v) {
        memcpy(e, PyBytes_AS_STRING(v), sizeof *e);
        return 0;
    }
    if (PyErr_Occurred()) return -1;
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(name, &len);
    if (!s) return -1;
    e->handle = nvtx_emit_register(s);
    e->color = nvtx_emit_color(s, (size_t)len);
    v = PyBytes_FromStringAndSize((const char *)e, sizeof *e);
    if (!v) return -1;
    int rc = PyDict_SetItem(cache, name, v);
    Py_DECREF(v);
    return rc;
}

/* (name, color=None, category=0) from a vectorcall; returns -1 with TypeError set. */
static int parse_range(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       entry_t *e, uint32_t *category)
{
    PyObject *v[3] = {NULL, Py_None, NULL};
    static const char *const kw[3] = {"name", "color", "category"};
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 3 arguments (%zd given)", fn, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) v[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int j = 0; j < 3; j++)
            if (PyUnicode_CompareWithASCIIString(key, kw[j]) == 0) slot = j;
        if (slot < 0 || slot < nargs) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated keyword argument '%U'", fn, key);
            return -1;
        }
        v[slot] = args[nargs + k];
    }
    if (!v[0]) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument 'name'", fn);
        return -1;
    }
    if (lookup(v[0], e) < 0) return -1;
    if (v[1] != Py_None) {
        unsigned long c = PyLong_AsUnsignedLong(v[1]);
        if (c == (unsigned long)-1 && PyErr_Occurred()) return -1;
        if (c > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "color must be a 32-bit ARGB int");
            return -1;
        }
        e->color = (uint32_t)c;
    }
    *category = 0;
    if (v[2]) {
        unsigned long c = PyLong_AsUnsignedLong(v[2]);
        if (c == (unsigned long)-1 && PyErr_Occurred()) return -1;
        if (c > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "category must fit in 32 bits");
            return -1;
        }
        *category = (uint32_t)c;
    }
    return 0;
}

static PyObject *py_push(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    entry_t e;
    uint32_t category;
    if (parse_range("nvtx_push", args, nargs, kwnames, &e, &category) < 0) return NULL;
    nvtx_emit_push(e.handle, e.color, category);
    Py_RETURN_NONE;
}

static PyObject *py_pop(PyObject *self, PyObject *unused)
{
    nvtx_emit_pop();
    Py_RETURN_NONE;
}

static PyObject *py_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    entry_t e;
    uint32_t category;
    if (parse_range("nvtx_range_start", args, nargs, kwnames, &e, &category) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(nvtx_emit_start(e.handle, e.color, category));
}

static PyObject *py_end(PyObject *self, PyObject *id)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(id);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    nvtx_emit_end(v);
    Py_RETURN_NONE;
}

static PyObject *py_init(PyObject *self, PyObject *name)
{
    const char *s = PyUnicode_AsUTF8(name);
    if (!s) return NULL;
    if (!*s || strlen(s) >= sizeof domain_name) {
        PyErr_SetString(PyExc_ValueError, "domain must be a non-empty str shorter than 256 bytes");
        return NULL;
    }
    uint32_t before = generation;
    nvtx_emit_init(s);
    if (generation != before) PyDict_Clear(cache); /* handles belong to the old domain */
    Py_RETURN_NONE;
}

static PyObject *py_color(PyObject *self, PyObject *name)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(name, &len);
    if (!s) return NULL;
    return PyLong_FromUnsignedLong(nvtx_emit_color(s, (size_t)len));
}

static PyObject *py_name_category(PyObject *self, PyObject *args)
{
    unsigned int category;
    const char *name;
    if (!PyArg_ParseTuple(args, "Is:nvtx_name_category", &category, &name)) return NULL;
    nvtx_emit_name_category(category, name);
    Py_RETURN_NONE;
}

static PyObject *py_available(PyObject *self, PyObject *unused) { return PyBool_FromLong(nvtx_emit_available()); }

static PyObject *py_domain(PyObject *self, PyObject *unused) { return PyUnicode_FromString(domain_name); }

static PyMethodDef nvtx_methods[] = {
    {"nvtx_init", py_init, METH_O, "nvtx_init(domain: str): create (once) and select the NVTX domain."},
    {"nvtx_domain", py_domain, METH_NOARGS, "nvtx_domain() -> str: the current domain name ('' before init)."},
    {"nvtx_color", py_color, METH_O, "nvtx_color(name: str) -> int: stable ARGB colour for name."},
    {"nvtx_push", (PyCFunction)(void (*)(void))py_push, METH_FASTCALL | METH_KEYWORDS,
     "nvtx_push(name, color=None, category=0): nvtxDomainRangePushEx with a registered name."},
    {"nvtx_pop", py_pop, METH_NOARGS, "nvtx_pop(): nvtxDomainRangePop."},
    {"nvtx_range_start", (PyCFunction)(void (*)(void))py_start, METH_FASTCALL | METH_KEYWORDS,
     "nvtx_range_start(name, color=None, category=0) -> int: nvtxDomainRangeStartEx."},
    {"nvtx_range_end", py_end, METH_O, "nvtx_range_end(id: int): nvtxDomainRangeEnd."},
    {"nvtx_name_category", py_name_category, METH_VARARGS, "nvtx_name_category(id: int, name: str)."},
    {"nvtx_available", py_available, METH_NOARGS, "nvtx_available() -> bool: built with the NVTX headers."},
    {NULL, NULL, 0, NULL},
};

int nvtx_add_functions(PyObject *m)
{
    if (!cache && !(cache = PyDict_New())) return -1;
    return PyModule_AddFunctions(m, nvtx_methods);
}
