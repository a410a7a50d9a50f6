/* The stage tree: an open-addressed (parent, name) -> node id table.
 *
 * Node 0 is the root.  Names are interned, so they compare by address.  Past
 * g_max_nodes named nodes, new stages fold into their parent's "(other)" child.
 */
#ifndef INSTRUMENT_NODES_H
#define INSTRUMENT_NODES_H

#include "core.h"

typedef struct {
    PyObject *name;      /* interned str; None for the root */
    int32_t parent;
    uint8_t other;       /* the "(other)" overflow node */
} Node;

#pragma GCC visibility push(hidden)

extern Node *g_nodes;
extern int32_t g_n_nodes;
extern int32_t *g_table;           /* open addressing: (parent, name) -> node id, -1 empty */
extern size_t g_table_mask;
extern int32_t g_max_nodes;        /* the cardinality cap */
extern uint32_t g_node_gen;        /* bumped when the node table is rebuilt: older node ids are void */

int nodes_init(void);              /* the root; 0, or -1 with an exception */
int32_t node_add(int32_t parent, PyObject *name);   /* node_child when the node does not exist yet */
int32_t node_uncounted(int32_t parent, PyObject *name);
void drop_nodes(void);

#pragma GCC visibility pop

static inline size_t node_hash(int32_t parent, PyObject *name) {
    uint64_t h = ((uint64_t)(uintptr_t)name >> 4) * 0x9E3779B97F4A7C15ull ^ (uint64_t)parent * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

static inline int32_t node_find(int32_t parent, PyObject *name) {
    size_t i = node_hash(parent, name) & g_table_mask;
    int32_t id;
    while ((id = g_table[i]) >= 0) {
        if (g_nodes[id].parent == parent && g_nodes[id].name == name) return id;
        i = (i + 1) & g_table_mask;
    }
    return -1;
}

/* The child of `parent` for `name`; past the cardinality cap, the parent's "(other)" child.  -1 when out of memory. */
static inline int32_t node_child(int32_t parent, PyObject *name) {
    int32_t id = node_find(parent, name);
    if (__builtin_expect(id >= 0, 1)) return id;
    return node_add(parent, name);
}

#endif
