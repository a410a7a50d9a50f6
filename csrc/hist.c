#include <stdlib.h>
#include <string.h>
#include "hist.h"

static uint64_t *hist_block(hist *h, int b) {
    if (!h->block[b]) h->block[b] = calloc(HIST_SUB, sizeof(uint64_t));
    return h->block[b];
}

int hist_add(hist *h, uint64_t v) {
    int i = hist_index(v);
    uint64_t *blk = h->block[i >> HIST_SUB_BITS];
    if (__builtin_expect(blk == NULL, 0) && !(blk = hist_block(h, i >> HIST_SUB_BITS))) return -1;
    blk[i & (HIST_SUB - 1)]++;
    return 0;
}

int hist_merge(hist *into, const hist *from) {
    for (int b = 0; b < HIST_BLOCKS; b++) {
        if (!from->block[b]) continue;
        uint64_t *dst = hist_block(into, b);
        if (!dst) return -1;
        for (int s = 0; s < HIST_SUB; s++) dst[s] += from->block[b][s];
    }
    return 0;
}

void hist_clear(hist *h) {
    for (int b = 0; b < HIST_BLOCKS; b++) {
        free(h->block[b]);
        h->block[b] = NULL;
    }
}

size_t hist_bytes(const hist *h) {
    size_t n = sizeof(hist);
    for (int b = 0; b < HIST_BLOCKS; b++) n += h->block[b] ? HIST_SUB * sizeof(uint64_t) : 0;
    return n;
}
