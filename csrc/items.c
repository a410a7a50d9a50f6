/* instrument.add(name, value=1): items of the innermost open stage (tokens, samples, bytes, ...).
 *
 * Each thread's slot of a node keeps a small array of (name, sums, calls), the
 * names interned and compared by address; a new name grows the array once, so
 * adding to a known name allocates nothing.  Outside any stage the items go to
 * the root's slot (node 0), reported as items outside stages. */
#include "items.h"   /* first: Python.h sets the feature macros */

#include <math.h>
#include <string.h>


#define ITEM_NAME_MAX 200

static PyObject *g_other_item = NULL;

static ItemStat *item_slot(NodeStats *s, PyObject *name) {
    for (int32_t k = 0; k < s->n_items; k++)
        if (s->items[k].name == name) return &s->items[k];
    if (s->n_items >= ITEMS_MAX) {
        if (!g_other_item && !(g_other_item = PyUnicode_InternFromString(OTHER_NAME))) return NULL;
        if (name != g_other_item) {
            warn_once("items", "instrument: more than %d distinct item names in one stage; the others are added "
                      "up as '" OTHER_NAME "'", ITEMS_MAX);
            return item_slot(s, g_other_item);
        }
    }
    if (s->n_items == s->cap_items) {
        int32_t ncap = s->cap_items ? s->cap_items * 2 : 4;
        if (ncap > ITEMS_MAX + 1) ncap = ITEMS_MAX + 1;
        ItemStat *v = realloc(s->items, (size_t)ncap * sizeof(ItemStat));
        if (!v) return NULL;
        s->items = v;
        s->cap_items = ncap;
    }
    ItemStat *it = &s->items[s->n_items++];
    Py_INCREF(name);
    it->name = name;
    it->n = 0;
    it->x = 0.0;
    it->calls = it->floats = 0;
    return it;
}

static void item_put(ItemStat *it, int64_t n, double x, uint64_t calls, uint64_t floats) {
    if (n > 0 && it->n > INT64_MAX - n) {   /* past 2**63: carried on in the float sum (reported as a float) */
        it->x += (double)it->n + (double)n;
        it->n = 0;
        if (!floats) floats = 1;
    } else {
        it->n += n;
    }
    it->x += x;
    it->calls += calls;
    it->floats += floats;
}

int items_merge(NodeStats *d, const NodeStats *s) {
    for (int32_t k = 0; k < s->n_items; k++) {
        const ItemStat *src = &s->items[k];
        ItemStat *it = item_slot(d, src->name);
        if (!it) return -1;
        item_put(it, src->n, src->x, src->calls, src->floats);
    }
    return 0;
}

void items_clear(NodeStats *s) {
    for (int32_t k = 0; k < s->n_items; k++) Py_DECREF(s->items[k].name);
    free(s->items);
    s->items = NULL;
    s->n_items = s->cap_items = 0;
}

PyObject *items_to_list(const NodeStats *s) {
    PyObject *l = PyList_New(s->n_items);
    if (!l) return NULL;
    for (int32_t k = 0; k < s->n_items; k++) {
        const ItemStat *it = &s->items[k];
        PyObject *t = Py_BuildValue("(OLdKK)", it->name, (long long)it->n, it->x, (unsigned long long)it->calls,
                                    (unsigned long long)it->floats);
        if (!t) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, k, t);
    }
    return l;
}

/* The value as an integer (*n) or a float (*x); -1 with the exception a bad value raises. */
static int item_value(PyObject *v, int64_t *n, double *x, int *is_float) {
    *n = 0;
    *x = 0.0;
    *is_float = 0;
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long r = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow > 0) {
            *x = PyLong_AsDouble(v);
            if (*x == -1.0 && PyErr_Occurred()) return -1;
            *is_float = 1;
            return 0;
        }
        if (overflow < 0 || r < 0) goto negative;
        *n = r;
        return 0;
    }
    if (PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "add() value must be a number of items (int or float), not bool");
        return -1;
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d)) {
            PyErr_Format(PyExc_ValueError, "add() value must be a finite number >= 0, got %R", v);
            return -1;
        }
        if (d < 0) goto negative;
        *x = d;
        *is_float = 1;
        return 0;
    }
    if (PyIndex_Check(v)) {   /* numpy integers and other int-likes */
        PyObject *i = PyNumber_Index(v);
        if (!i) return -1;
        int r = item_value(i, n, x, is_float);
        Py_DECREF(i);
        return r;
    }
    if (Py_TYPE(v)->tp_as_number && Py_TYPE(v)->tp_as_number->nb_float) {   /* numpy floats, Decimal */
        PyObject *f = PyNumber_Float(v);
        if (!f) return -1;
        int r = item_value(f, n, x, is_float);
        Py_DECREF(f);
        return r;
    }
    PyErr_Format(PyExc_TypeError, "add() value must be a number of items (int or float), not %.100s",
                 Py_TYPE(v)->tp_name);
    return -1;
negative:
    PyErr_Format(PyExc_ValueError, "add() value must be >= 0 (items are counted, not taken back), got %R", v);
    return -1;
}

static int item_name_ok(PyObject *name) {
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "add() item name must be a str, not %.100s", Py_TYPE(name)->tp_name);
        return 0;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(name);
    if (len == 0) {
        PyErr_SetString(PyExc_ValueError, "add() item name must not be empty");
        return 0;
    }
    if (len > ITEM_NAME_MAX) {
        PyErr_Format(PyExc_ValueError, "add() item name is %zd characters long; at most %d are allowed", len,
                     ITEM_NAME_MAX);
        return 0;
    }
    return 1;
}

/* add(name, value=1)'s arguments: the item name, interned and held (*name), and its value; -1 with the exception a
 * bad argument raises. */
int items_parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **name_out, int64_t *n,
                double *x, int *is_float) {
    PyObject *name = nargs > 0 ? args[0] : NULL, *value = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2) { PyErr_Format(PyExc_TypeError, "add() takes an item name and a value: add(name, value=1)"); return -1; }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        PyObject **slot = PyUnicode_CompareWithASCIIString(kw, "value") == 0 ? &value
                        : PyUnicode_CompareWithASCIIString(kw, "name") == 0 ? &name : NULL;
        if (!slot) { PyErr_Format(PyExc_TypeError, "add() got an unexpected keyword argument %R", kw); return -1; }
        if (*slot) { PyErr_Format(PyExc_TypeError, "add() got multiple values for argument %R", kw); return -1; }
        *slot = args[nargs + k];
    }
    if (!name) { PyErr_Format(PyExc_TypeError, "add() needs the item name: add(name, value=1)"); return -1; }
    if (!item_name_ok(name)) return -1;
    *n = 1, *x = 0.0, *is_float = 0;
    if (value && item_value(value, n, x, is_float) < 0) return -1;
    if (PyUnicode_CHECK_INTERNED(name)) {
        Py_INCREF(name);
    } else {   /* held until used: an interned str lives only as long as someone holds it */
        name = PyUnicode_CheckExact(name) ? Py_NewRef(name) : PyUnicode_FromObject(name);   /* a subclass: its str */
        if (!name) return -1;
        PyUnicode_InternInPlace(&name);
    }
    *name_out = name;
    return 0;
}

int items_add(NodeStats *s, PyObject *name, int64_t n, double x, int is_float) {
    ItemStat *it = item_slot(s, name);
    if (!it) return -1;
    item_put(it, n, x, 1, (uint64_t)is_float);
    return 0;
}
