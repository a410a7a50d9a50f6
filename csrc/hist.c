#include <stdlib.h>
#include <string.h>
#include "hist.h"

/* Block b's place in h->counts plus 1, made (zeroed) where it is new; 0 when out of memory. */
static int hist_block(hist *h, int b) {
    if (h->at[b]) return h->at[b];
    uint64_t *c = realloc(h->counts, (size_t)(h->n + 1) * HIST_SUB * sizeof(uint64_t));
    if (!c) return 0;
    memset(c + (size_t)h->n * HIST_SUB, 0, HIST_SUB * sizeof(uint64_t));
    h->counts = c;
    return h->at[b] = ++h->n;
}

int hist_add(hist *h, uint64_t v) {
    int i = hist_index(v), b = i >> HIST_SUB_BITS, k = h->at[b];
    if (__builtin_expect(k == 0, 0) && !(k = hist_block(h, b))) return -1;
    h->counts[(size_t)(k - 1) * HIST_SUB + (i & (HIST_SUB - 1))]++;
    return 0;
}

int hist_merge(hist *into, const hist *from) {
    for (int b = 0; b < HIST_BLOCKS; b++) {
        const uint64_t *src = hist_block_of(from, b);
        if (!src) continue;
        int k = hist_block(into, b);
        if (!k) return -1;
        uint64_t *dst = into->counts + (size_t)(k - 1) * HIST_SUB;
        for (int s = 0; s < HIST_SUB; s++) dst[s] += src[s];
    }
    return 0;
}

void hist_clear(hist *h) {
    free(h->counts);
    memset(h, 0, sizeof *h);
}

size_t hist_bytes(const hist *h) {
    return sizeof(hist) + (size_t)h->n * HIST_SUB * sizeof(uint64_t);
}
