/* The served-checksum sum of a chunk (sources/served.py), in one place for the two C users: the mount's C
 * read path (fuse/_direct.c) and the Python reads' helper (sources/_sums.c). Each little-endian 64-bit word,
 * the last one zero-padded, xored with its index times SUM_K1, times SUM_K2, added up modulo 2^64: a
 * multiply and two adds per 8 bytes. */
#ifndef CKPTFS_CHUNK_SUM_H
#define CKPTFS_CHUNK_SUM_H

#include <stdint.h>
#include <string.h>

#define SUM_CHUNK 65536
#define SUM_K1 0x9E3779B97F4A7C15ULL
#define SUM_K2 0xC2B2AE3D27D4EB4FULL

static uint64_t chunk_sum(const unsigned char *bytes, size_t n) {
    uint64_t sum = 0, word;
    size_t words = n / 8, i;
    for (i = 0; i < words; i++) {
        memcpy(&word, bytes + 8 * i, 8);
        sum += (word ^ (i * SUM_K1)) * SUM_K2;
    }
    if (n % 8) {
        word = 0;
        memcpy(&word, bytes + 8 * words, n % 8);
        sum += (word ^ (words * SUM_K1)) * SUM_K2;
    }
    return sum;
}

#endif
