/* Fixed-size, mergeable, log-bucketed histogram of non-negative nanosecond values.
 *
 * Block 0 holds 0..63 exactly; block b >= 1 covers [2^(b+5), 2^(b+6)) in 64
 * linear sub-buckets of width 2^(b-1), so any value is within 1/128 (0.78%)
 * of its bucket's midpoint.  Blocks are allocated on first use, side by side in
 * one array: memory per histogram is bounded by HIST_BLOCKS * 512 bytes and does
 * not grow with the number of values recorded.  Values from 2^47 ns (39 h) up land in the last bucket.
 */
#ifndef INSTRUMENT_HIST_H
#define INSTRUMENT_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 6
#define HIST_SUB (1 << HIST_SUB_BITS)
#define HIST_BLOCKS 42

typedef struct {
    uint64_t *counts;               /* the blocks seen, HIST_SUB counts each, in the order first seen */
    uint8_t at[HIST_BLOCKS];        /* block b's place in counts plus 1; 0: not seen yet */
    uint8_t n;                      /* blocks in counts */
} hist;

/* Block b's counts, or NULL where no value has fallen in it. */
static inline const uint64_t *hist_block_of(const hist *h, int b) {
    return h->at[b] ? h->counts + (size_t)(h->at[b] - 1) * HIST_SUB : NULL;
}

static inline int hist_index(uint64_t v) {
    if (v < HIST_SUB) return (int)v;
    int e = 63 - __builtin_clzll(v);
    int b = e - (HIST_SUB_BITS - 1);
    if (b >= HIST_BLOCKS) return HIST_BLOCKS * HIST_SUB - 1;
    return (b << HIST_SUB_BITS) | (int)((v >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1));
}

int hist_add(hist *h, uint64_t v);              /* 0, or -1 when out of memory (value not counted) */
int hist_merge(hist *into, const hist *from);   /* 0, or -1 when out of memory */
void hist_clear(hist *h);                       /* frees the blocks */
size_t hist_bytes(const hist *h);

#endif
