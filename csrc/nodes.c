/* The stage tree: node creation, table growth, the cardinality cap, reset. */
#include "nodes.h"   /* first: Python.h sets the feature macros */

#include <string.h>

Node *g_nodes = NULL;
int32_t g_n_nodes = 0;
int32_t *g_table = NULL;
size_t g_table_mask = 0;
int32_t g_max_nodes = 10000;
uint32_t g_node_gen = 1;

static int32_t g_cap_nodes = 0;
static int32_t g_n_named = 0;           /* nodes counted against the cap */
static PyObject *g_other_name = NULL;

static int table_grow(void) {
    size_t ncap = g_table_mask ? (g_table_mask + 1) * 2 : 256;
    int32_t *t = malloc(ncap * sizeof(int32_t));
    if (!t) return -1;
    memset(t, 0xff, ncap * sizeof(int32_t));
    for (int32_t id = 1; id < g_n_nodes; id++) {
        size_t i = node_hash(g_nodes[id].parent, g_nodes[id].name) & (ncap - 1);
        while (t[i] >= 0) i = (i + 1) & (ncap - 1);
        t[i] = id;
    }
    free(g_table);
    g_table = t;
    g_table_mask = ncap - 1;
    return 0;
}

static int32_t node_new(int32_t parent, PyObject *name, int other) {
    if (g_n_nodes == g_cap_nodes) {
        int32_t ncap = g_cap_nodes ? g_cap_nodes * 2 : 64;
        Node *n = realloc(g_nodes, (size_t)ncap * sizeof(Node));
        if (!n) return -1;
        g_nodes = n;
        g_cap_nodes = ncap;
    }
    if ((size_t)(g_n_nodes + 1) * 2 > g_table_mask + 1 && table_grow() < 0) return -1;
    int32_t id = g_n_nodes++;
    Py_INCREF(name);
    g_nodes[id].name = name;
    g_nodes[id].parent = parent;
    g_nodes[id].other = (uint8_t)other;
    size_t i = node_hash(parent, name) & g_table_mask;
    while (g_table[i] >= 0) i = (i + 1) & g_table_mask;
    g_table[i] = id;
    return id;
}

int32_t node_add(int32_t parent, PyObject *name) {
    int32_t id;
    if (g_n_named < g_max_nodes) {
        id = node_new(parent, name, 0);
        if (id >= 0) g_n_named++;
        return id;
    }
    g_folded++;
    if (g_nodes[parent].other) return parent;   /* everything under (other) folds into it */
    id = node_find(parent, g_other_name);
    if (id < 0) {
        id = node_new(parent, g_other_name, 1);
        warn_once("cardinality", "instrument: more than %d distinct stages; new ones are folded into '" OTHER_NAME
                  "' (configure(max_stages=...) raises the cap)", (int)g_max_nodes);
    }
    return id;
}

/* A node outside the cardinality cap (the calibration stage's): found or made, never counted nor folded. */
int32_t node_uncounted(int32_t parent, PyObject *name) {
    int32_t id = node_find(parent, name);
    return id >= 0 ? id : node_new(parent, name, 0);
}

int nodes_init(void) {
    g_other_name = PyUnicode_InternFromString(OTHER_NAME);
    if (!g_other_name) return -1;
    if (table_grow() < 0 || node_new(-1, Py_None, 0) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Forget the stage tree too, when no frame refers to it. */
void drop_nodes(void) {
    if (g_open_frames != 0) return;
    for (int32_t id = 1; id < g_n_nodes; id++) Py_DECREF(g_nodes[id].name);
    g_n_nodes = 1;
    g_n_named = 0;
    g_node_gen++;
    memset(g_table, 0xff, (g_table_mask + 1) * sizeof(int32_t));
    size_t i = node_hash(-1, Py_None) & g_table_mask;
    g_table[i] = 0;
}
