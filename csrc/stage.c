/* Stage and Region: the types users hold.  Stage's __enter__ and __exit__ are
 * a descriptor in the type that hands out a callable cached on the stage
 * (StageCall), so `with stage:` allocates nothing; Region calls its function
 * between enter and exit, in C. */
#include "stage.h"   /* first: Python.h sets the feature macros */

#include <structmember.h>

#include "enter_exit.h"
#include "nvtx_emit.h"

/* ----------------------------------------------------------- Stage methods */

int check_name(PyObject *name) {
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "stage name must be a str, not %.100s", Py_TYPE(name)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GetLength(name);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "stage name must not be empty");
        return -1;
    }
    if (n > MAX_NAME_LEN) {
        PyErr_Format(PyExc_ValueError, "stage name is %zd characters long; at most %d are allowed", n, MAX_NAME_LEN);
        return -1;
    }
    return 0;
}

PyObject *stage_new(PyObject *name, PyObject *color, uint32_t category) {
    if (check_name(name) < 0) return NULL;
    uint32_t argb;
    if (color && color != Py_None) {
        unsigned long c = PyLong_Check(color) ? PyLong_AsUnsignedLong(color) : (unsigned long)-1;
        if (c == (unsigned long)-1 || c > 0xFFFFFFFFul) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "color must be an int 0xRRGGBB or 0xAARRGGBB, got %R", color);
            return NULL;
        }
        argb = c <= 0xFFFFFFul ? (uint32_t)c | 0xFF000000u : (uint32_t)c;
    } else {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(name, &n);
        if (!utf8) return NULL;
        argb = nvtx_emit_color(utf8, (size_t)n);
    }
    Stage *s = PyObject_GC_New(Stage, &Stage_Type);
    if (!s) return NULL;
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    s->name = name;
    s->bound[0] = s->bound[1] = NULL;
    s->nvtx_message = NULL;
    s->nvtx_gen = 0;
    s->color = argb;
    s->category = category;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static PyObject *Stage_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *name, *color = Py_None;
    unsigned int category = 0;
    static char *kwlist[] = {"name", "color", "category", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$I:Stage", kwlist, &name, &color, &category)) return NULL;
    return stage_new(name, color, category);
}

static int Stage_traverse(Stage *s, visitproc visit, void *arg) {
    Py_VISIT(s->bound[0]);
    Py_VISIT(s->bound[1]);
    return 0;
}

static int Stage_clear(Stage *s) {
    Py_CLEAR(s->bound[0]);
    Py_CLEAR(s->bound[1]);
    return 0;
}

static void Stage_dealloc(Stage *s) {
    PyObject_GC_UnTrack(s);
    Stage_clear(s);
    Py_DECREF(s->name);
    PyObject_GC_Del(s);
}

static PyObject *Stage_repr(Stage *self) { return PyUnicode_FromFormat("instrument.stage(%R)", self->name); }

/* `@stage` on a function: the live side's decorator (set_decorator) wraps it, as `@region` does. */
static PyObject *g_decorator = NULL;

PyObject *mod_set_decorator(PyObject *m, PyObject *f) {
    if (!PyCallable_Check(f))
        return PyErr_Format(PyExc_TypeError, "set_decorator needs a callable, not %.100s", Py_TYPE(f)->tp_name);
    Py_XSETREF(g_decorator, Py_NewRef(f));
    Py_RETURN_NONE;
}

static PyObject *Stage_call(Stage *self, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) != 1 || (kw && PyDict_GET_SIZE(kw)))
        return PyErr_Format(PyExc_TypeError, "a stage used as a decorator takes the function alone: "
                            "@instrument.stage(%R) above a def", self->name);
    if (!g_decorator)
        return PyErr_Format(PyExc_TypeError, "stage %R cannot decorate before instrument is imported", self->name);
    return PyObject_CallFunctionObjArgs(g_decorator, (PyObject *)self, PyTuple_GET_ITEM(args, 0), NULL);
}

static PyObject *Stage_get_name(Stage *self, void *c) { Py_INCREF(self->name); return self->name; }

static PyObject *Stage_get_color(Stage *self, void *c) { return PyLong_FromUnsignedLong(self->color); }
static PyObject *Stage_get_category(Stage *self, void *c) { return PyLong_FromUnsignedLong(self->category); }

static PyGetSetDef Stage_getset[] = {
    {"name", (getter)Stage_get_name, NULL, "the stage's name", NULL},
    {"color", (getter)Stage_get_color, NULL, "ARGB colour of its NVTX range", NULL},
    {"category", (getter)Stage_get_category, NULL, "NVTX category id (0: none)", NULL},
    {NULL}
};

/* __enter__ and __exit__: a descriptor in the type that hands out a callable
 * cached on the stage, instead of a new bound method at every `with`. */
typedef struct {
    PyObject_HEAD
    Stage *stage;
    int which;           /* 0 enter, 1 exit */
    vectorcallfunc vectorcall;
} StageCall;

static PyObject *stage_call_impl(Stage *st, int which, PyObject *const *args, Py_ssize_t nargs) {
    if (which == 0) {
        stage_enter(st);
        Py_INCREF(st);
        return (PyObject *)st;
    }
    stage_exit(st, nargs > 0 && args[0] != Py_None);
    Py_RETURN_FALSE;
}

static PyObject *StageCall_vectorcall(StageCall *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return stage_call_impl(c->stage, c->which, args, PyVectorcall_NARGS(nargsf));
}

static int StageCall_traverse(StageCall *c, visitproc visit, void *arg) { Py_VISIT(c->stage); return 0; }
static int StageCall_clear(StageCall *c) { Py_CLEAR(c->stage); return 0; }
static void StageCall_dealloc(StageCall *c) {
    PyObject_GC_UnTrack(c);
    StageCall_clear(c);
    PyObject_GC_Del(c);
}

static PyTypeObject StageCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._StageCall",
    .tp_basicsize = sizeof(StageCall),
    .tp_dealloc = (destructor)StageCall_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)StageCall_traverse,
    .tp_clear = (inquiry)StageCall_clear,
    .tp_vectorcall_offset = offsetof(StageCall, vectorcall),
};

typedef struct {
    PyObject_HEAD
    int which;
    vectorcallfunc vectorcall;
} StageMethod;

static PyObject *StageMethod_get(StageMethod *m, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None || !PyObject_TypeCheck(obj, &Stage_Type)) { Py_INCREF(m); return (PyObject *)m; }
    Stage *st = (Stage *)obj;
    PyObject *b = st->bound[m->which];
    if (!b) {
        StageCall *c = PyObject_GC_New(StageCall, &StageCall_Type);
        if (!c) return NULL;
        Py_INCREF(st);
        c->stage = st;
        c->which = m->which;
        c->vectorcall = (vectorcallfunc)StageCall_vectorcall;
        PyObject_GC_Track(c);
        st->bound[m->which] = b = (PyObject *)c;
    }
    Py_INCREF(b);
    return b;
}

/* Stage.__enter__(stage) called on the class */
static PyObject *StageMethod_vectorcall(StageMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1 || !PyObject_TypeCheck(args[0], &Stage_Type))
        return PyErr_Format(PyExc_TypeError, "Stage.%s needs a Stage as its first argument", m->which ? "__exit__" : "__enter__");
    return stage_call_impl((Stage *)args[0], m->which, args + 1, n - 1);
}

static PyTypeObject StageMethod_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native._StageMethod",
    .tp_basicsize = sizeof(StageMethod),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_descr_get = (descrgetfunc)StageMethod_get,
    .tp_vectorcall_offset = offsetof(StageMethod, vectorcall),
};

PyTypeObject Stage_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native.Stage",
    .tp_doc = "A named stage: `with stage:` times the block and nests it under the enclosing stage.",
    .tp_basicsize = sizeof(Stage),
    .tp_dealloc = (destructor)Stage_dealloc,
    .tp_repr = (reprfunc)Stage_repr,
    .tp_call = (ternaryfunc)Stage_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Stage_traverse,
    .tp_clear = (inquiry)Stage_clear,
    .tp_getset = Stage_getset,
    .tp_new = Stage_tp_new,
};

static int stage_type_ready(void) {
    if (PyType_Ready(&StageCall_Type) < 0 || PyType_Ready(&StageMethod_Type) < 0 || PyType_Ready(&Stage_Type) < 0) return -1;
    static const char *names[2] = {"__enter__", "__exit__"};
    for (int w = 0; w < 2; w++) {
        StageMethod *m = PyObject_New(StageMethod, &StageMethod_Type);
        if (!m) return -1;
        m->which = w;
        m->vectorcall = (vectorcallfunc)StageMethod_vectorcall;
        int r = PyDict_SetItemString(Stage_Type.tp_dict, names[w], (PyObject *)m);
        Py_DECREF(m);
        if (r < 0) return -1;
    }
    PyType_Modified(&Stage_Type);
    return 0;
}

/* ------------------------------------------------------------- Region type */

/* A function wrapped in a stage: calls it between enter and exit, in C. */
typedef struct {
    PyObject_HEAD
    Stage *stage;
    PyObject *func;
    PyObject *dict;
    vectorcallfunc vectorcall;
} Region;

static PyObject *Region_vectorcall(Region *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    stage_enter(self->stage);
    PyObject *r = PyObject_Vectorcall(self->func, args, nargsf, kwnames);
    stage_exit(self->stage, r == NULL);
    return r;
}

static PyObject *Region_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *stage, *func;
    if (!PyArg_ParseTuple(args, "O!O:Region", &Stage_Type, &stage, &func)) return NULL;
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError, "region() needs a callable, not %.100s", Py_TYPE(func)->tp_name);
        return NULL;
    }
    Region *r = (Region *)type->tp_alloc(type, 0);
    if (!r) return NULL;
    Py_INCREF(stage);
    Py_INCREF(func);
    r->stage = (Stage *)stage;
    r->func = func;
    r->dict = NULL;
    r->vectorcall = (vectorcallfunc)Region_vectorcall;
    return (PyObject *)r;
}

static int Region_traverse(Region *self, visitproc visit, void *arg) {
    Py_VISIT(self->func);
    Py_VISIT(self->dict);
    return 0;
}

static int Region_clear(Region *self) {
    Py_CLEAR(self->func);
    Py_CLEAR(self->dict);
    return 0;
}

static void Region_dealloc(Region *self) {
    PyObject_GC_UnTrack(self);
    Region_clear(self);
    Py_CLEAR(self->stage);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *Region_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyObject *Region_call(Region *self, PyObject *args, PyObject *kw) {
    stage_enter(self->stage);
    PyObject *r = PyObject_Call(self->func, args, kw);
    stage_exit(self->stage, r == NULL);
    return r;
}

static PyObject *Region_repr(Region *self) { return PyUnicode_FromFormat("<instrument.region %R of %R>", self->stage->name, self->func); }

static PyMemberDef Region_members[] = {
    {"stage", T_OBJECT, offsetof(Region, stage), READONLY, "the stage the calls are timed in"},
    {"__wrapped__", T_OBJECT, offsetof(Region, func), READONLY, "the wrapped function"},
    {NULL}
};

PyTypeObject Region_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._native.Region",
    .tp_doc = "Region(stage, func): func called inside stage.",
    .tp_basicsize = sizeof(Region),
    .tp_dealloc = (destructor)Region_dealloc,
    .tp_repr = (reprfunc)Region_repr,
    .tp_call = (ternaryfunc)Region_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)Region_traverse,
    .tp_clear = (inquiry)Region_clear,
    .tp_descr_get = Region_get,
    .tp_dictoffset = offsetof(Region, dict),
    .tp_vectorcall_offset = offsetof(Region, vectorcall),
    .tp_members = Region_members,
    .tp_new = Region_tp_new,
};

int stage_types_init(void) {
    return stage_type_ready() < 0 || PyType_Ready(&Region_Type) < 0 ? -1 : 0;
}
