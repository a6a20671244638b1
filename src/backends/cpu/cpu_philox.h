/* cpu_philox.h - Philox4x32-10 (Salmon et al., "Parallel random numbers: as
 * easy as 1, 2, 3", SC'11), the counter-based generator behind every random
 * op. Standalone (stdint only) so tests can check it against Random123's
 * known-answer vectors and other backends can mirror it bit for bit.
 *
 * needle's stream: element i of a random op uses the 128-bit counter
 * {lo32(offset + i), hi32(offset + i), 0, 0} and the key {lo32(seed),
 * hi32(seed)}; it may use any of the 4 output words. */
#ifndef ND_CPU_PHILOX_H
#define ND_CPU_PHILOX_H

#include <stdint.h>

static inline void nd_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                    uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u; /* key schedule: golden ratio, sqrt(3) - 1 */
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 4 words for stream position `counter` under `seed`. */
static inline void nd_philox_at(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    nd_philox4x32_10(ctr, key, out);
}

/* The words of the 8 stream positions counter .. counter + 7: out[k][j] is
 * word k of position counter + j (nd_philox_at's, one position at a time;
 * cpu_random.c has the vector version). */
static inline void nd_philox_at8(uint64_t seed, uint64_t counter, uint32_t out[4][8]) {
    for (int j = 0; j < 8; j++) {
        uint32_t w[4];
        nd_philox_at(seed, counter + (uint64_t)j, w);
        out[0][j] = w[0], out[1][j] = w[1], out[2][j] = w[2], out[3][j] = w[3];
    }
}

#endif
