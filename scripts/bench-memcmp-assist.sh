#!/usr/bin/env bash
# Times glibc's memcmp and memset where a masked vector load reaches memory that is not mapped:
# a zero-length call on Rust's dangling pointer for an empty string (0x1), and a 3-byte compare
# at the end of a page. On the AMD Zen 5 EPYC these benchmarks run on, glibc 2.36's AVX-512
# (EVEX) versions take about 100 ns there against 2 ns elsewhere: the processor suppresses the
# fault of the masked-off bytes with a slow assist. The AVX2 versions, which check for a page
# crossing instead, do not; GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512VL selects them.
#
#   scripts/bench-memcmp-assist.sh        # as glibc chooses
#   GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512VL scripts/bench-memcmp-assist.sh
#
# Needs a C compiler. Prints one JSON line of nanoseconds per call.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/assist.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define CALLS 1000000
/* Nanoseconds per evaluation of expr, through function pointers the compiler cannot inline. */
#define NS(expr) ({ struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0); \
    for (int i = 0; i < CALLS; i++) { expr; __asm__ volatile("" ::: "memory"); } \
    clock_gettime(CLOCK_MONOTONIC, &t1); \
    ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / CALLS; })
int main(void) {
    int (*volatile cmp)(const void *, const void *, size_t) = memcmp;
    void *(*volatile set)(void *, int, size_t) = memset;
    char *heap = malloc(64), *other = malloc(64);
    memset(heap, 1, 64);
    memset(other, 1, 64);
    char *dangling = (char *)1; /* what Rust passes for "" and an empty Vec */
    char *page = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(page + 4096, 4096);
    memset(page, 1, 4096);
    char *last3 = page + 4096 - 3;
    printf("{\"bench\":\"memcmp-assist\",\"tunables\":\"%s\",\"ns_per_call\":{"
           "\"memcmp_len3\":%.1f,\"memcmp_len0\":%.1f,\"memcmp_len0_dangling\":%.1f,"
           "\"memset_len0_dangling\":%.1f,\"memcmp_len3_page_end\":%.1f}}\n",
           getenv("GLIBC_TUNABLES") ? getenv("GLIBC_TUNABLES") : "",
           NS(cmp(heap, other, 3)), NS(cmp(heap, other, 0)), NS(cmp(heap, dangling, 0)),
           NS(set(dangling, 0, 0)), NS(cmp(last3, other, 3)));
    return 0;
}
C
${CC:-cc} -O2 -o "$work/assist" "$work/assist.c"
"$work/assist"
