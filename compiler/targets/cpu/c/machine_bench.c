/* machine_bench.c: the CPU target's microbenchmark of one core (machine.py builds it with
 * the target's flags for the machine's instruction set, runs it once per machine and
 * caches the figures).
 *
 * Each kernel runs a loop of independent instruction chains, enough of them to cover the
 * instructions' latency, so the loop runs at the machine's throughput for them:
 *
 *   VDLA_MB_CLOCK   a chain of dependent 64-bit register-to-register adds (one cycle
 *                   each on every x86 core): cycles per nanosecond, the clock the core
 *                   runs at. Not adds of an immediate: Golden Cove (Sapphire Rapids)
 *                   folds those at rename, several a cycle, which read as a 13 GHz clock
 *   VDLA_MB_FMA512  float32 FMAs on 512-bit vectors (AVX-512F), 16 accumulators
 *   VDLA_MB_FMA256  float32 FMAs on 256-bit vectors (FMA3), 12 accumulators
 *   VDLA_MB_DOT512  int8 dot products, vpdpbusd on 512 bits (AVX-512 VNNI)
 *   VDLA_MB_DOT256  vpdpbusd on 256 bits (AVX-512 VNNI with VL, or AVX-VNNI)
 *   VDLA_MB_MADD256 the AVX2 int8 path of vdla_cpu.h (vpmaddubsw, vpmaddwd with ones,
 *                   vpaddd), u8 operands loaded from memory as a kernel's are
 *
 * vdla_mb_ops(kind) is the work of one loop iteration (adds, FMAs or multiply-adds);
 * a kernel the compiler's flags do not enable is absent (vdla_mb_ops returns 0).
 * vdla_mb_stream reads a buffer with vector loads: one core's read bandwidth.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <x86intrin.h>
#define VDLA_MB_X86 1
#endif

enum { VDLA_MB_CLOCK, VDLA_MB_FMA512, VDLA_MB_FMA256, VDLA_MB_DOT512, VDLA_MB_DOT256,
       VDLA_MB_MADD256, VDLA_MB_KINDS };

/* Results go here so the compiler cannot drop the loops that compute them. */
static volatile double vdla_mb_sink;

#define R4(s) s s s s
#define R20(s) R4(s) R4(s) R4(s) R4(s) R4(s)
/* X(i) for accumulators 0 to n - 1 (literal indices: they are pasted into names) */
#define A8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define A12(X) A8(X) X(8) X(9) X(10) X(11)
#define A16(X) A12(X) X(12) X(13) X(14) X(15)

#if defined(VDLA_MB_X86)
static void mb_clock(int64_t iters) {
    uint64_t x = 0, one = 1;
    for (int64_t i = 0; i < iters; i++)
        __asm__ volatile(R20("addq %1, %0\n\t") : "+r"(x) : "r"(one));
    vdla_mb_sink = (double)x;
}
#endif

#if defined(VDLA_MB_X86) && defined(__AVX512F__)
static void mb_fma512(int64_t iters) {
    __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    /* b and c in registers, not folded into each FMA as a broadcast memory operand */
    __asm__("" : "+v"(b), "+v"(c));
#define DECL(i) __m512 a##i = _mm512_set1_ps(1.0f + (i));
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, b, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    A16(DECL)
    for (int64_t i = 0; i < iters; i++) { A16(STEP) }
    __m512 s = _mm512_setzero_ps();
    A16(SUM)
    vdla_mb_sink = _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}
#endif

#if defined(VDLA_MB_X86) && defined(__FMA__)
static void mb_fma256(int64_t iters) {
    __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    __asm__("" : "+x"(b), "+x"(c));
#define DECL(i) __m256 a##i = _mm256_set1_ps(1.0f + (i));
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, b, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);
    A12(DECL)
    for (int64_t i = 0; i < iters; i++) { A12(STEP) }
    __m256 s = _mm256_setzero_ps();
    A12(SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    vdla_mb_sink = out[0];
#undef DECL
#undef STEP
#undef SUM
}
#endif

#if defined(VDLA_MB_X86) && defined(__AVX512VNNI__) && defined(__AVX512F__)
#define VDLA_MB_HAS_DOT512 1
static void mb_dot512(int64_t iters) {
    __m512i x = _mm512_set1_epi32(0x01020304), w = _mm512_set1_epi32(0x05060708);
    __asm__("" : "+v"(x), "+v"(w));
#define DECL(i) __m512i a##i = _mm512_set1_epi32(i);
#define STEP(i) a##i = _mm512_dpbusd_epi32(a##i, x, w);
#define SUM(i) s = _mm512_add_epi32(s, a##i);
    A16(DECL)
    for (int64_t i = 0; i < iters; i++) { A16(STEP) }
    __m512i s = _mm512_setzero_si512();
    A16(SUM)
    vdla_mb_sink = _mm512_reduce_add_epi32(s);
#undef DECL
#undef STEP
#undef SUM
}
#endif

#if defined(VDLA_MB_X86) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VDLA_MB_DPBUSD256(a, x, w) _mm256_dpbusd_epi32(a, x, w)
#elif defined(VDLA_MB_X86) && defined(__AVXVNNI__)
#define VDLA_MB_DPBUSD256(a, x, w) _mm256_dpbusd_avx_epi32(a, x, w)
#endif

#if defined(VDLA_MB_DPBUSD256)
static void mb_dot256(int64_t iters) {
    __m256i x = _mm256_set1_epi32(0x01020304), w = _mm256_set1_epi32(0x05060708);
    __asm__("" : "+x"(x), "+x"(w));
#define DECL(i) __m256i a##i = _mm256_set1_epi32(i);
#define STEP(i) a##i = VDLA_MB_DPBUSD256(a##i, x, w);
#define SUM(i) s = _mm256_add_epi32(s, a##i);
    A12(DECL)
    for (int64_t i = 0; i < iters; i++) { A12(STEP) }
    __m256i s = _mm256_setzero_si256();
    A12(SUM)
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, s);
    vdla_mb_sink = out[0];
#undef DECL
#undef STEP
#undef SUM
}
#endif

#if defined(VDLA_MB_X86) && defined(__AVX2__)
/* vdla_cpu.h's vdla_avx2_dot4: the pair sums of vpmaddubsw widened by vpmaddwd with ones.
   Each accumulator reads its own u8 vector from memory (a kernel's input pixels), so no
   product is shared between accumulators or hoisted out of the loop. */
static void mb_madd256(int64_t iters) {
    static int8_t data[8 * 32] __attribute__((aligned(32)));
    const int8_t *p = data;
    __m256i w = _mm256_set1_epi32(0x05060708), one = _mm256_set1_epi16(1);
    for (int i = 0; i < 8 * 32; i++) data[i] = (int8_t)(i & 0x7f);
#define DECL(i) __m256i a##i = _mm256_set1_epi32(i);
#define STEP(i) a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(                         \
        _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(p + 32 * (i))), w), one));
#define SUM(i) s = _mm256_add_epi32(s, a##i);
    A8(DECL)
    for (int64_t i = 0; i < iters; i++) {
        __asm__("" : "+r"(p));          /* the loads happen in every iteration */
        A8(STEP)
    }
    __m256i s = _mm256_setzero_si256();
    A8(SUM)
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, s);
    vdla_mb_sink = out[0];
#undef DECL
#undef STEP
#undef SUM
}
#endif

/* The work of one iteration of kernel `kind` (adds, FMAs or multiply-adds), 0 when this
   build lacks it. */
double vdla_mb_ops(int kind) {
    switch (kind) {
#if defined(VDLA_MB_X86)
    case VDLA_MB_CLOCK: return 20;
#endif
#if defined(VDLA_MB_X86) && defined(__AVX512F__)
    case VDLA_MB_FMA512: return 16 * 16;
#endif
#if defined(VDLA_MB_X86) && defined(__FMA__)
    case VDLA_MB_FMA256: return 12 * 8;
#endif
#if defined(VDLA_MB_HAS_DOT512)
    case VDLA_MB_DOT512: return 16 * 64;
#endif
#if defined(VDLA_MB_DPBUSD256)
    case VDLA_MB_DOT256: return 12 * 32;
#endif
#if defined(VDLA_MB_X86) && defined(__AVX2__)
    case VDLA_MB_MADD256: return 8 * 32;
#endif
    default: return 0;
    }
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static uint64_t ticks(void) {
#if defined(VDLA_MB_X86)
    return __rdtsc();
#else
    return 0;
#endif
}

/* Run kernel `kind` for `iters` iterations: the nanoseconds it took, and in *tsc the
   time-stamp counter's ticks over the same span (0 off x86); -1 when this build lacks
   the kernel. */
double vdla_mb_run(int kind, int64_t iters, double *tsc) {
    if (vdla_mb_ops(kind) == 0) return -1;
    uint64_t t0 = ticks();
    double start = now_ns();
    switch (kind) {
#if defined(VDLA_MB_X86)
    case VDLA_MB_CLOCK: mb_clock(iters); break;
#endif
#if defined(VDLA_MB_X86) && defined(__AVX512F__)
    case VDLA_MB_FMA512: mb_fma512(iters); break;
#endif
#if defined(VDLA_MB_X86) && defined(__FMA__)
    case VDLA_MB_FMA256: mb_fma256(iters); break;
#endif
#if defined(VDLA_MB_HAS_DOT512)
    case VDLA_MB_DOT512: mb_dot512(iters); break;
#endif
#if defined(VDLA_MB_DPBUSD256)
    case VDLA_MB_DOT256: mb_dot256(iters); break;
#endif
#if defined(VDLA_MB_X86) && defined(__AVX2__)
    case VDLA_MB_MADD256: mb_madd256(iters); break;
#endif
    default: break;
    }
    double elapsed = now_ns() - start;
    *tsc = (double)(ticks() - t0);
    return elapsed;
}

/* One core's read bandwidth, bytes per nanosecond (GB/s): the best of `repeats` passes
   over a buffer of `bytes` (a multiple of 256), read with 32-byte vector loads into 8
   accumulators; -1 when the buffer cannot be allocated. */
double vdla_mb_stream(int64_t bytes, int repeats) {
    typedef float v8 __attribute__((vector_size(32)));
    v8 *p = aligned_alloc(64, (size_t)bytes);
    if (p == NULL) return -1;
    memset(p, 0, (size_t)bytes);        /* touch every page before timing */
    int64_t n = bytes / (int64_t)sizeof(v8);
    double best = 0;
    for (int r = 0; r < repeats; r++) {
        v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        double start = now_ns();
        for (int64_t i = 0; i < n; i += 8) {
            s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3];
            s4 += p[i + 4]; s5 += p[i + 5]; s6 += p[i + 6]; s7 += p[i + 7];
        }
        double elapsed = now_ns() - start;
        v8 s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
        vdla_mb_sink = s[0];
        if (elapsed > 0 && bytes / elapsed > best) best = bytes / elapsed;
    }
    free(p);
    return best;
}
