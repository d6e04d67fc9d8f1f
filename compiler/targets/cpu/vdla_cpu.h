/* vdla_cpu.h: what every C file the CPU target generates includes.
 *
 * Vectors are GCC/clang vector extensions, so the generated kernels are plain C that any
 * recent gcc or clang compiles for any CPU (the portable fallback); on x86 a few helpers
 * use the instructions the compiler reports (-march=native: AVX-512 VNNI, AVX2, ...),
 * which is where the speed and, for int8, the exactness come from:
 *
 *   v{f,i,u}N   N lanes (16 or 8) of float / int32 / uint32; vbN: N int8 lanes
 *   viN_dot4    acc + four u8 x s8 products per lane (AVX-512 VNNI vpdpbusd; AVX2
 *               vpmaddubsw + vpmaddwd, exact while every u8 is < 128; portable loops);
 *               the weights a broadcast word (viN_dot4) or a vector (viN_dot4vv)
 *   ..._any     the same for any u8 (AVX2 splits each byte in nibbles: no int16
 *               saturation); elsewhere the same function
 *   viN_dot4vv_sign  acc + four s8 x s8 products per lane, w never -128 (AVX2: the
 *               sign moved onto w, then vpmaddubsw + vpmaddwd, exact)
 *   vdla_amx_*  AMX tiles (the amx instruction set's int8 GEMMs; at the end), or with
 *               -DVDLA_AMX_MODEL a software model of them for machines without AMX
 *
 * Integer arithmetic follows vdla.compiler.reference.integer: int32 lanes that wrap
 * (computed on uint32, where wrap-around is defined), >> arithmetic.
 */
#ifndef VDLA_CPU_H
#define VDLA_CPU_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* -DVDLA_PORTABLE: no intrinsics at all (the portable fallback, also on x86) */
#if !defined(VDLA_PORTABLE) && (defined(__x86_64__) || defined(__i386__))
#define VDLA_X86 1
#include <immintrin.h>
#endif

_Static_assert((-3 >> 1) == -2, "vdla's CPU target needs arithmetic >> on signed ints");

#define VDLA_INLINE static inline __attribute__((always_inline))

/* gcc vectorizes floor() and selects between doubles only without trapping math, which
   -O3 keeps on; a kernel whose loops floor doubles asks for it (no kernel here traps on
   or tests floating-point exceptions). */
#if defined(__GNUC__) && !defined(__clang__)
#define VDLA_NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math")))
#else
#define VDLA_NO_TRAPPING_MATH
#endif

/* The 64-byte vector types are passed between always-inlined helpers only; gcc's note
   that their ABI changes without AVX-512 does not apply. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* Two vectors shuffled by constant indices into their concatenation; M is the integer
   vector type of the indices, which gcc's builtin takes and clang's does not. */
#if defined(__clang__)
#define VDLA_SHUFFLE2(a, b, M, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define VDLA_SHUFFLE2(a, b, M, ...) __builtin_shuffle(a, b, (M){__VA_ARGS__})
#endif

/* requantize(a, multiplier, shift) of vdla.compiler.reference.integer; m == 0: none. */
VDLA_INLINE int32_t vdla_rq(int32_t a, int32_t m, int32_t s) {
    uint32_t u = (uint32_t)a;
    if (m) u *= (uint32_t)m;
    if (s > 0) return ((int32_t)(u + (1u << (s - 1)))) >> s;
    return (int32_t)(u << (-s));
}

VDLA_INLINE int8_t vdla_clamp8(int32_t v, int32_t lo, int32_t hi) {
    return (int8_t)(v < lo ? lo : v > hi ? hi : v);
}

/* ---- vector types --------------------------------------------------------------------- */

#define VDLA_REP8(x) x, x, x, x, x, x, x, x
#define VDLA_REP16(x) VDLA_REP8(x), VDLA_REP8(x)

#define VDLA_VECTORS(N, BYTES)                                                               \
typedef float    vf##N __attribute__((vector_size(4 * (N))));                                \
typedef int32_t  vi##N __attribute__((vector_size(4 * (N))));                                \
typedef uint32_t vu##N __attribute__((vector_size(4 * (N))));                                \
typedef int8_t   vb##N __attribute__((vector_size(BYTES)));                                  \
VDLA_INLINE vf##N vf##N##_load(const float *p) { vf##N v; memcpy(&v, p, sizeof v); return v; } \
VDLA_INLINE vi##N vi##N##_load(const void *p) { vi##N v; memcpy(&v, p, sizeof v); return v; } \
VDLA_INLINE void vf##N##_store(float *p, vf##N v) { memcpy(p, &v, sizeof v); }               \
/* (a constructor of equal lanes, which compilers emit as a broadcast; not 0 + x, which   \
   is no identity for x = -0.0 and costs a scalar add) */                                    \
VDLA_INLINE vf##N vf##N##_bcast(float x) { return (vf##N){VDLA_REP##N(x)}; }                 \
VDLA_INLINE vi##N vi##N##_bcast(int32_t x) { return (vi##N){VDLA_REP##N(x)}; }               \
/* the first n lanes from p, the others 0 (never reads past p + n) */                       \
VDLA_INLINE vf##N vf##N##_load_n(const float *p, int n) {                                    \
    vf##N v = {0}; memcpy(&v, p, (size_t)n * 4); return v; }                                 \
VDLA_INLINE vi##N vi##N##_load_n(const void *p, int n) {                                     \
    vi##N v = {0}; memcpy(&v, p, (size_t)n * 4); return v; }                                 \
/* int8 lanes, sign-extended (vi##N##_widen); lanes narrowed to int8 (their low byte) */    \
VDLA_INLINE vi##N vi##N##_from_s8(const int8_t *p) { return vi##N##_widen(p); }              \
VDLA_INLINE vi##N vi##N##_from_s8_n(const int8_t *p, int n) {                                \
    int8_t t[N] = {0}; memcpy(t, p, (size_t)n); return vi##N##_widen(t); }                   \
VDLA_INLINE void vi##N##_store_s8(int8_t *p, vi##N v) { vi##N##_narrow(p, v); }              \
VDLA_INLINE void vi##N##_store_s8_n(int8_t *p, vi##N v, int n) {                             \
    int8_t t[N]; vi##N##_narrow(t, v); memcpy(p, t, (size_t)n); }                            \
VDLA_INLINE void vf##N##_store_n(float *p, vf##N v, int n) { memcpy(p, &v, (size_t)n * 4); } \
VDLA_INLINE vf##N vf##N##_max_generic(vf##N a, vf##N b) {                                    \
    vi##N m = a > b; return (vf##N)(((vi##N)a & m) | ((vi##N)b & ~m)); }                     \
VDLA_INLINE vf##N vf##N##_min_generic(vf##N a, vf##N b) {                                    \
    vi##N m = a < b; return (vf##N)(((vi##N)a & m) | ((vi##N)b & ~m)); }                     \
VDLA_INLINE vi##N vi##N##_max_generic(vi##N a, vi##N b) {                                    \
    vi##N m = a > b; return (a & m) | (b & ~m); }                                            \
VDLA_INLINE vi##N vi##N##_min_generic(vi##N a, vi##N b) {                                    \
    vi##N m = a < b; return (a & m) | (b & ~m); }                                            \
/* requantize every lane with one multiplier (0: none) and shift, then wrap-add r */         \
VDLA_INLINE vi##N vi##N##_rq(vi##N a, int32_t m, int32_t s) {                                \
    vu##N u = (vu##N)a;                                                                      \
    if (m) u *= (uint32_t)m;                                                                 \
    if (s > 0) return ((vi##N)(u + (1u << (s - 1)))) >> s;                                   \
    return (vi##N)(u << (-s));                                                               \
}                                                                                            \
/* per-lane multipliers, every one nonzero, and shifts, every one in [1, 31]: rqv's      \
   arithmetic without its selects (what most layers' tables hold) */                        \
VDLA_INLINE vi##N vi##N##_rqp(vi##N a, vi##N m, vi##N s) {                                   \
    vu##N one = (vu##N){0} + 1u, u = (vu##N)a * (vu##N)m;                                    \
    return ((vi##N)(u + (one << ((vu##N)s - one)))) >> s;                                    \
}                                                                                            \
/* per-lane multipliers (0: none) and shifts */                                              \
VDLA_INLINE vi##N vi##N##_rqv(vi##N a, vi##N m, vi##N s) {                                   \
    vu##N u = (vu##N)a, one = (vu##N){0} + 1u;                                               \
    vi##N has = m != 0;                                                                      \
    u = (u * (vu##N)m & (vu##N)has) | (u & ~(vu##N)has);                                     \
    vi##N right = s > 0;                                                                     \
    vu##N sr = (vu##N)(s & right), sl = (vu##N)(-s & ~right);                                \
    vu##N round = (one << ((sr - one) & 31u)) & (vu##N)right;                                        \
    vi##N r = ((vi##N)(u + round)) >> (vi##N)sr;                                             \
    return (r & right) | ((vi##N)(u << sl) & ~right);                                        \
}

/* Widening int8 -> int32 lanes and narrowing back (the low byte of each lane): with
   intrinsics on x86 (compilers turn __builtin_convertvector into scalar code here). */
typedef int32_t vdla_i16x __attribute__((vector_size(64)));
typedef int32_t vdla_i8x __attribute__((vector_size(32)));
VDLA_INLINE vdla_i16x vi16_widen(const int8_t *p) {
#if defined(VDLA_X86) && defined(__AVX512F__)
    return (vdla_i16x)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif defined(VDLA_X86) && defined(__AVX2__)
    __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    vdla_i16x v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v;
#else
    vdla_i16x v; for (int i = 0; i < 16; i++) v[i] = p[i]; return v;
#endif
}
VDLA_INLINE vdla_i8x vi8_widen(const int8_t *p) {
#if defined(VDLA_X86) && defined(__AVX2__)
    return (vdla_i8x)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    vdla_i8x v; for (int i = 0; i < 8; i++) v[i] = p[i]; return v;
#endif
}
/* (AVX2: saturating packs, which equal truncation for lanes already in [-128, 127], as
   every caller's are) */
VDLA_INLINE void vi16_narrow(int8_t *p, vdla_i16x v) {
#if defined(VDLA_X86) && defined(__AVX512F__)
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8((__m512i)v));
#elif defined(VDLA_X86) && defined(__AVX2__)
    __m256i lo, hi; memcpy(&lo, &v, 32); memcpy(&hi, (char *)&v + 32, 32);
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8);
    __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128((__m128i *)p, b);
#else
    for (int i = 0; i < 16; i++) p[i] = (int8_t)v[i];
#endif
}
VDLA_INLINE void vi8_narrow(int8_t *p, vdla_i8x v) {
#if defined(VDLA_X86) && defined(__AVX512F__) && defined(__AVX512VL__)
    _mm_storel_epi64((__m128i *)p, _mm256_cvtepi32_epi8((__m256i)v));
#elif defined(VDLA_X86) && defined(__AVX2__)
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128((__m256i)v),
                                _mm256_extracti128_si256((__m256i)v, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
#else
    for (int i = 0; i < 8; i++) p[i] = (int8_t)v[i];
#endif
}

VDLA_VECTORS(16, 16)
VDLA_VECTORS(8, 8)

/* acc += w * (a broadcast of *p), the broadcast folded into the multiply-add as an
   AVX-512 memory operand ({1toN}). Compilers fold it themselves only when one
   multiply-add uses the broadcast; a register tile of several channel vectors shares
   it, and the separate broadcast then took a slot on the pipes the multiply-adds use
   (an AMD Zen 4 host ran such tiles 1.4x slower than with the operand folded). */
#if defined(VDLA_X86) && defined(__AVX512F__)
#define vf16_fma_bcast(acc_, w_, p_)                                                         \
    __asm__("vfmadd231ps %[x]%{1to16%}, %[b], %[a]" : [a] "+v"(acc_) : [b] "v"(w_), [x] "m"(*(p_)))
#else
#define vf16_fma_bcast(acc, w, p) ((acc) = vf16_fma((w), vf16_bcast(*(p)), (acc)))
#endif
#if defined(VDLA_X86) && defined(__AVX512F__) && defined(__AVX512VL__)
#define vf8_fma_bcast(acc_, w_, p_)                                                          \
    __asm__("vfmadd231ps %[x]%{1to8%}, %[b], %[a]" : [a] "+v"(acc_) : [b] "v"(w_), [x] "m"(*(p_)))
#else
/* Without AVX-512, a broadcast then a multiply-add: `vf8_fma` (below), since in the C
   standard mode the target builds in gcc contracts no a * b + c itself, and a multiply
   and an add took twice the pipe slots of one FMA (AVX2's float32 1x1 layers). */
#define vf8_fma_bcast(acc, w, p) ((acc) = vf8_fma((w), vf8_bcast(*(p)), (acc)))
#endif

/* min and max: one instruction each where x86 has them (compilers emit a compare and a
   blend for the generic select). Float max/min here are not NaN-propagating. */
#if defined(VDLA_X86) && defined(__AVX512F__)
VDLA_INLINE vf16 vf16_max(vf16 a, vf16 b) { return (vf16)_mm512_max_ps((__m512)a, (__m512)b); }
VDLA_INLINE vf16 vf16_min(vf16 a, vf16 b) { return (vf16)_mm512_min_ps((__m512)a, (__m512)b); }
VDLA_INLINE vi16 vi16_max(vi16 a, vi16 b) { return (vi16)_mm512_max_epi32((__m512i)a, (__m512i)b); }
VDLA_INLINE vi16 vi16_min(vi16 a, vi16 b) { return (vi16)_mm512_min_epi32((__m512i)a, (__m512i)b); }
#else
VDLA_INLINE vf16 vf16_max(vf16 a, vf16 b) { return vf16_max_generic(a, b); }
VDLA_INLINE vf16 vf16_min(vf16 a, vf16 b) { return vf16_min_generic(a, b); }
VDLA_INLINE vi16 vi16_max(vi16 a, vi16 b) { return vi16_max_generic(a, b); }
VDLA_INLINE vi16 vi16_min(vi16 a, vi16 b) { return vi16_min_generic(a, b); }
#endif
#if defined(VDLA_X86) && defined(__AVX2__)
VDLA_INLINE vf8 vf8_max(vf8 a, vf8 b) { return (vf8)_mm256_max_ps((__m256)a, (__m256)b); }
VDLA_INLINE vf8 vf8_min(vf8 a, vf8 b) { return (vf8)_mm256_min_ps((__m256)a, (__m256)b); }
VDLA_INLINE vi8 vi8_max(vi8 a, vi8 b) { return (vi8)_mm256_max_epi32((__m256i)a, (__m256i)b); }
VDLA_INLINE vi8 vi8_min(vi8 a, vi8 b) { return (vi8)_mm256_min_epi32((__m256i)a, (__m256i)b); }
#else
VDLA_INLINE vf8 vf8_max(vf8 a, vf8 b) { return vf8_max_generic(a, b); }
VDLA_INLINE vf8 vf8_min(vf8 a, vf8 b) { return vf8_min_generic(a, b); }
VDLA_INLINE vi8 vi8_max(vi8 a, vi8 b) { return vi8_max_generic(a, b); }
VDLA_INLINE vi8 vi8_min(vi8 a, vi8 b) { return vi8_min_generic(a, b); }
#endif

/* a * b + c rounded once (FMA) where the instruction set has it: the C standard mode the
   target builds in (-std=c11) keeps gcc from contracting a * b + c itself. Elsewhere two
   roundings (the float kernels are checked within a tolerance, not bit for bit). */
#if defined(VDLA_X86) && defined(__FMA__)
VDLA_INLINE vf8 vf8_fma(vf8 a, vf8 b, vf8 c) {
    return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
VDLA_INLINE vf8 vf8_fma(vf8 a, vf8 b, vf8 c) { return a * b + c; }
#endif
#if defined(VDLA_X86) && defined(__AVX512F__)
VDLA_INLINE vf16 vf16_fma(vf16 a, vf16 b, vf16 c) {
    return (vf16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(VDLA_X86) && defined(__FMA__)
VDLA_INLINE vf16 vf16_fma(vf16 a, vf16 b, vf16 c) {
    vf8 x[2], y[2], z[2];
    memcpy(x, &a, 64); memcpy(y, &b, 64); memcpy(z, &c, 64);
    x[0] = vf8_fma(x[0], y[0], z[0]); x[1] = vf8_fma(x[1], y[1], z[1]);
    vf16 r; memcpy(&r, x, 64); return r; }
#else
VDLA_INLINE vf16 vf16_fma(vf16 a, vf16 b, vf16 c) { return a * b + c; }
#endif

/* Keeps a vector in a register: gcc otherwise folds a weight vector that a register tile
   of several rows shares into every row's multiply as a memory operand, one load per row
   instead of one per step, and the loads then bound the tile (a 6 x 2 tile of dense
   rows: 18 loads for 12 multiply-adds). */
#if defined(VDLA_X86) && defined(__AVX512F__)
#define VDLA_IN_REGISTER(v) __asm__("" : "+v"(v))
#elif defined(VDLA_X86)
#define VDLA_IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define VDLA_IN_REGISTER(v) ((void)0)
#endif

/* ---- int8 dot products: acc + sum over the 4 bytes of each lane of u8(x) * s8(w) ------- */

/* vv: both operands vectors (x: 4 u8 per lane, w: 4 s8 per lane); the others broadcast
   one 32-bit word of four s8 weights. */
#define VDLA_DOT4_PORTABLE(N)                                                                \
VDLA_INLINE vi##N vi##N##_dot4vv_portable(vi##N acc, vi##N x, vi##N w) {                     \
    for (int k = 0; k < 4; k++)                                                              \
        acc += ((x >> (8 * k)) & 0xff) * ((vi##N)((vu##N)w << (24 - 8 * k)) >> 24);                        \
    return acc;                                                                              \
}
VDLA_DOT4_PORTABLE(16)
VDLA_DOT4_PORTABLE(8)

#if defined(VDLA_X86) && defined(__AVX2__)
/* u8 x s8 pairs summed in int16 (vpmaddubsw) are exact while every u8 is < 128:
   2 * 127 * 128 < 32768. */
VDLA_INLINE __m256i vdla_avx2_dot4(__m256i acc, __m256i x, __m256i w) {
    __m256i pairs = _mm256_maddubs_epi16(x, w);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
/* Any u8: split each byte in nibbles (each pair sum <= 2 * 15 * 128), 16 * hi + lo. */
VDLA_INLINE __m256i vdla_avx2_dot4_any(__m256i acc, __m256i x, __m256i w) {
    const __m256i low = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    __m256i lo = _mm256_and_si256(x, low);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
    __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, w), one);
    __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, w), one);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_slli_epi32(phi, 4), plo));
}
#endif

#if defined(VDLA_X86) && defined(__AVX512VNNI__) && defined(__AVX512F__)
#define VDLA_VNNI512 1
#endif
#if defined(VDLA_X86) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VDLA_VNNI256 1
#endif

/* every u8 of x < 128 (an input known non-negative) */
VDLA_INLINE vi16 vi16_dot4vv(vi16 acc, vi16 x, vi16 w) {
#if defined(VDLA_VNNI512)
    return (vi16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)x, (__m512i)w);
#elif defined(VDLA_X86) && defined(__AVX2__)
    __m256i a[2], b[2], c[2];
    memcpy(a, &acc, 64); memcpy(b, &x, 64); memcpy(c, &w, 64);
    a[0] = vdla_avx2_dot4(a[0], b[0], c[0]); a[1] = vdla_avx2_dot4(a[1], b[1], c[1]);
    memcpy(&acc, a, 64); return acc;
#else
    return vi16_dot4vv_portable(acc, x, w);
#endif
}
/* any u8 */
VDLA_INLINE vi16 vi16_dot4vv_any(vi16 acc, vi16 x, vi16 w) {
#if defined(VDLA_X86) && defined(__AVX2__) && !defined(VDLA_VNNI512)
    __m256i a[2], b[2], c[2];
    memcpy(a, &acc, 64); memcpy(b, &x, 64); memcpy(c, &w, 64);
    a[0] = vdla_avx2_dot4_any(a[0], b[0], c[0]); a[1] = vdla_avx2_dot4_any(a[1], b[1], c[1]);
    memcpy(&acc, a, 64); return acc;
#else
    return vi16_dot4vv(acc, x, w);
#endif
}
VDLA_INLINE vi8 vi8_dot4vv(vi8 acc, vi8 x, vi8 w) {
#if defined(VDLA_VNNI256)
    return (vi8)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)x, (__m256i)w);
#elif defined(VDLA_X86) && defined(__AVX2__)
    return (vi8)vdla_avx2_dot4((__m256i)acc, (__m256i)x, (__m256i)w);
#else
    return vi8_dot4vv_portable(acc, x, w);
#endif
}
VDLA_INLINE vi8 vi8_dot4vv_any(vi8 acc, vi8 x, vi8 w) {
#if defined(VDLA_X86) && defined(__AVX2__) && !defined(VDLA_VNNI256)
    return (vi8)vdla_avx2_dot4_any((__m256i)acc, (__m256i)x, (__m256i)w);
#else
    return vi8_dot4vv(acc, x, w);
#endif
}
/* acc + the four s8 x s8 products of each lane: x any int8, w's bytes in [-127, 127]
   (never -128: the quantizer's weights, `vdla.compiler.passes.quantize`), xa = viN_abs8(x)
   (computed once per broadcast x, shared by the vectors it multiplies). AVX2's
   vpmaddubsw takes u8 x s8, so the sign moves to w: x * w = |x| * (w * sgn(x)), with
   |x| = vpabsb(x) as u8 (|-128| = 0x80 = 128, right as u8) and w * sgn(x) computed as
   (w ^ m) - m with m = (x < 0 ? -1 : 0) per byte (w where x >= 0: x == 0 multiplies
   |x| = 0), in [-127, 127] because w != -128 (-(-128) wraps to -128). Each product is
   at most 128 * 127 = 16256 in magnitude, a pair sum at most 32512 < 32767: vpmaddubsw
   never saturates; vpmaddwd with ones adds the pairs into int32 (at most 65024) and the
   sum is exact. (vpsignb(w, x) computes the same w * sgn(x) in one instruction, but an
   AMD Zen 4 runs it on fewer pipes: the dense kernel 7% slower than with xor and sub.)
   Five instructions for four products a lane (m and |x| are once per x), against the
   nibble split's ten (_any) or int16 vpmaddwd's four on twice the weight bytes.
   Elsewhere: plain s8 x s8 C, exact for any w. */
#define VDLA_DOT4_SIGNED(N)                                                                  \
VDLA_INLINE vi##N vi##N##_dot4vv_s8_portable(vi##N acc, vi##N x, vi##N w) {                  \
    for (int k = 0; k < 4; k++)                                                              \
        acc += ((vi##N)((vu##N)x << (24 - 8 * k)) >> 24)                                     \
               * ((vi##N)((vu##N)w << (24 - 8 * k)) >> 24);                                  \
    return acc;                                                                              \
}
VDLA_DOT4_SIGNED(16)
VDLA_DOT4_SIGNED(8)
VDLA_INLINE vi8 vi8_abs8(vi8 x) {
#if defined(VDLA_X86) && defined(__AVX2__)
    return (vi8)_mm256_abs_epi8((__m256i)x);
#else
    return x;      /* (unused by the portable product) */
#endif
}
VDLA_INLINE vi8 vi8_dot4vv_sign(vi8 acc, vi8 xa, vi8 x, vi8 w) {
#if defined(VDLA_X86) && defined(__AVX2__)
    const __m256i neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), (__m256i)x);
    const __m256i ws = _mm256_sub_epi8(_mm256_xor_si256((__m256i)w, neg), neg);
    __m256i pairs = _mm256_maddubs_epi16((__m256i)xa, ws);
    return (vi8)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#else
    (void)xa;
    return vi8_dot4vv_s8_portable(acc, x, w);
#endif
}
/* 16 lanes: AVX2 as two halves; AVX-512 has no vpsignb on 512 bits (and its VNNI path
   does not take this product), so there and elsewhere the portable C. */
VDLA_INLINE vi16 vi16_abs8(vi16 x) {
#if defined(VDLA_X86) && defined(__AVX2__) && !defined(__AVX512BW__)
    __m256i h[2]; memcpy(h, &x, 64);
    h[0] = _mm256_abs_epi8(h[0]); h[1] = _mm256_abs_epi8(h[1]);
    memcpy(&x, h, 64);
#endif
    return x;
}
VDLA_INLINE vi16 vi16_dot4vv_sign(vi16 acc, vi16 xa, vi16 x, vi16 w) {
#if defined(VDLA_X86) && defined(__AVX2__) && !defined(__AVX512BW__)
    vi8 a[2], b[2], c[2], d[2];
    memcpy(a, &acc, 64); memcpy(b, &xa, 64); memcpy(c, &x, 64); memcpy(d, &w, 64);
    a[0] = vi8_dot4vv_sign(a[0], b[0], c[0], d[0]);
    a[1] = vi8_dot4vv_sign(a[1], b[1], c[1], d[1]);
    memcpy(&acc, a, 64); return acc;
#else
    (void)xa;
    return vi16_dot4vv_s8_portable(acc, x, w);
#endif
}
/* acc + the two int16 products of each lane's halves (x and w: two int16 per lane), exact
   (AVX2 vpmaddwd; each pair sum is at most 2 * 2**30 when the int16 hold int8 values) */
VDLA_INLINE vi8 vi8_madd16(vi8 acc, vi8 x, vi8 w) {
#if defined(VDLA_X86) && defined(__AVX2__)
    return (vi8)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16((__m256i)x, (__m256i)w));
#else
    return acc + ((x << 16) >> 16) * ((w << 16) >> 16) + (x >> 16) * (w >> 16);
#endif
}
VDLA_INLINE vi16 vi16_madd16(vi16 acc, vi16 x, vi16 w) {
#if defined(VDLA_X86) && defined(__AVX512BW__)
    return (vi16)_mm512_add_epi32((__m512i)acc, _mm512_madd_epi16((__m512i)x, (__m512i)w));
#else
    return acc + ((x << 16) >> 16) * ((w << 16) >> 16) + (x >> 16) * (w >> 16);
#endif
}
VDLA_INLINE vi16 vi16_dot4(vi16 acc, vi16 x, int32_t w) { return vi16_dot4vv(acc, x, vi16_bcast(w)); }
VDLA_INLINE vi16 vi16_dot4_any(vi16 acc, vi16 x, int32_t w) { return vi16_dot4vv_any(acc, x, vi16_bcast(w)); }
VDLA_INLINE vi8 vi8_dot4(vi8 acc, vi8 x, int32_t w) { return vi8_dot4vv(acc, x, vi8_bcast(w)); }
VDLA_INLINE vi8 vi8_dot4_any(vi8 acc, vi8 x, int32_t w) { return vi8_dot4vv_any(acc, x, vi8_bcast(w)); }

/* ---- stores that drop lanes, loads that spread them -----------------------------------
 * A convolution computes a grid wider than its output (rows padded to the input's
 * pitch); `keep` has one bit per lane to keep. compress: the kept lanes stored one after
 * another at p; expand: that many values read from p into the kept lanes (others 0). */

/* An 8x8 transpose in place: r[j][i] becomes r[i][j] (the pointwise kernel's tile of
   8 pixels x 8 channels to 8 channel rows of 8 pixels). Unpacks and lane shuffles on
   x86 (24 shuffles for 64 values); element by element elsewhere. */
VDLA_INLINE void vf8_transpose8(vf8 r[8]) {
#if defined(VDLA_X86) && defined(__AVX__)
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps((__m256)r[2 * k], (__m256)r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps((__m256)r[2 * k], (__m256)r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = (vf8)_mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
        r[k + 4] = (vf8)_mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
    }
#else
    float t[8][8];
    memcpy(t, r, sizeof t);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) r[i][j] = t[j][i];
#endif
}

/* The low (h = 0) or high (h = 1) eight lanes of a 16-lane vector. */
VDLA_INLINE vf8 vf16_half(vf16 v, int h) {
    vf8 out; memcpy(&out, (const char *)&v + 32 * h, 32); return out;
}

#if defined(VDLA_X86) && defined(__AVX512F__) && defined(__AVX512VL__) \
    && defined(__AVX512BW__) && defined(__AVX512VBMI2__)
#define VDLA_COMPRESS_X86 1
#endif

VDLA_INLINE int vdla_popcount(uint32_t keep) { return __builtin_popcount(keep); }

VDLA_INLINE void vf16_store_keep(float *p, vf16 v, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    /* the register form: compress-to-memory is slow on some CPUs (Zen 4) */
    __m512 c = _mm512_maskz_compress_ps((__mmask16)keep, (__m512)v);
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << vdla_popcount(keep)) - 1), c);
#else
    float t[16]; memcpy(t, &v, 64);
    for (int i = 0, j = 0; i < 16; i++) if (keep >> i & 1) p[j++] = t[i];
#endif
}
VDLA_INLINE void vf8_store_keep(float *p, vf8 v, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m256 c = _mm256_maskz_compress_ps((__mmask8)keep, (__m256)v);
    _mm256_mask_storeu_ps(p, (__mmask8)((1u << vdla_popcount(keep)) - 1), c);
#else
    float t[8]; memcpy(t, &v, 32);
    for (int i = 0, j = 0; i < 8; i++) if (keep >> i & 1) p[j++] = t[i];
#endif
}
VDLA_INLINE vf16 vf16_load_keep(const float *p, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << vdla_popcount(keep)) - 1), p);
    return (vf16)_mm512_maskz_expand_ps((__mmask16)keep, v);
#else
    float t[16] = {0};
    for (int i = 0, j = 0; i < 16; i++) if (keep >> i & 1) t[i] = p[j++];
    return vf16_load(t);
#endif
}
VDLA_INLINE vf8 vf8_load_keep(const float *p, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m256 v = _mm256_maskz_loadu_ps((__mmask8)((1u << vdla_popcount(keep)) - 1), p);
    return (vf8)_mm256_maskz_expand_ps((__mmask8)keep, v);
#else
    float t[8] = {0};
    for (int i = 0, j = 0; i < 8; i++) if (keep >> i & 1) t[i] = p[j++];
    return vf8_load(t);
#endif
}
VDLA_INLINE void vi16_store_s8_keep(int8_t *p, vi16 v, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m128i b = _mm512_cvtepi32_epi8((__m512i)v);
    __m128i c = _mm_maskz_compress_epi8((__mmask16)keep, b);
    _mm_mask_storeu_epi8(p, (__mmask16)((1u << vdla_popcount(keep)) - 1), c);
#else
    int32_t t[16]; memcpy(t, &v, 64);
    for (int i = 0, j = 0; i < 16; i++) if (keep >> i & 1) p[j++] = (int8_t)t[i];
#endif
}
VDLA_INLINE void vi8_store_s8_keep(int8_t *p, vi8 v, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m128i b = _mm256_cvtepi32_epi8((__m256i)v);
    __m128i c = _mm_maskz_compress_epi8((__mmask16)keep, b);
    _mm_mask_storeu_epi8(p, (__mmask16)((1u << vdla_popcount(keep)) - 1), c);
#else
    int32_t t[8]; memcpy(t, &v, 32);
    for (int i = 0, j = 0; i < 8; i++) if (keep >> i & 1) p[j++] = (int8_t)t[i];
#endif
}
VDLA_INLINE vi16 vi16_from_s8_keep(const int8_t *p, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << vdla_popcount(keep)) - 1), p);
    return (vi16)_mm512_cvtepi8_epi32(_mm_maskz_expand_epi8((__mmask16)keep, b));
#else
    int32_t t[16] = {0};
    for (int i = 0, j = 0; i < 16; i++) if (keep >> i & 1) t[i] = p[j++];
    return vi16_load(t);
#endif
}
VDLA_INLINE vi8 vi8_from_s8_keep(const int8_t *p, uint32_t keep) {
#if defined(VDLA_COMPRESS_X86)
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << vdla_popcount(keep)) - 1), p);
    return (vi8)_mm256_cvtepi8_epi32(_mm_maskz_expand_epi8((__mmask16)keep, b));
#else
    int32_t t[8] = {0};
    for (int i = 0, j = 0; i < 8; i++) if (keep >> i & 1) t[i] = p[j++];
    return vi8_load(t);
#endif
}

/* ---- repacking a convolution's input ---------------------------------------------------
 * One row of a phase plane: column c holds input column c * stride + start, or the
 * padding outside [0, w) and where the row is NULL (a padding row). */

static inline int vdla_min(int a, int b) { return a < b ? a : b; }
static inline int vdla_max(int a, int b) { return a > b ? a : b; }

/* The columns [lo, hi) of a row whose column c reads input column c * stride + start,
   that read inside [0, w). */
static inline void vdla_inside(int cols, int w, int stride, int start, int *lo, int *hi) {
    int a = start >= 0 ? 0 : (-start + stride - 1) / stride;
    int b = w - start <= 0 ? 0 : (w - start + stride - 1) / stride;
    *lo = vdla_min(cols, a);
    *hi = vdla_max(*lo, vdla_min(cols, b));
}

static inline void vdla_packf(float *restrict dst, const float *restrict src, int cols,
                              int w, int stride, int start) {
    if (!src) { memset(dst, 0, (size_t)cols * 4); return; }
    int lo, hi; vdla_inside(cols, w, stride, start, &lo, &hi);
    memset(dst, 0, (size_t)lo * 4);
    if (stride == 1) memcpy(dst + lo, src + lo + start, (size_t)(hi - lo) * 4);
    else if (stride == 2) for (int c = lo; c < hi; c++) dst[c] = src[2 * c + start];
    else for (int c = lo; c < hi; c++) dst[c] = src[c * stride + start];
    memset(dst + hi, 0, (size_t)(cols - hi) * 4);
}

static inline void vdla_packb(int8_t *restrict dst, const int8_t *restrict src, int cols,
                              int w, int stride, int start) {
    if (!src) { memset(dst, 0, (size_t)cols); return; }
    int lo, hi; vdla_inside(cols, w, stride, start, &lo, &hi);
    memset(dst, 0, (size_t)lo);
    if (stride == 1) memcpy(dst + lo, src + lo + start, (size_t)(hi - lo));
    else if (stride == 2) for (int c = lo; c < hi; c++) dst[c] = src[2 * c + start];
    else for (int c = lo; c < hi; c++) dst[c] = src[c * stride + start];
    memset(dst + hi, 0, (size_t)(cols - hi));
}

/* Four channels' rows interleaved, one 32-bit pixel each, every byte XORed with `flip`
   (0x80 stores x + 128); a NULL row (a padded channel, a padding row) reads as 0. */
static inline void vdla_pack4(uint8_t *restrict dst, const int8_t *const src[4], int cols,
                              int w, int stride, int start, int flip) {
    const uint8_t pad = (uint8_t)flip;
    if (!src[0] && !src[1] && !src[2] && !src[3]) {
        memset(dst, pad, (size_t)cols * 4);
        return;
    }
    int lo = 0, hi = 0, c = 0;
    if (stride == 1) {
        vdla_inside(cols, w, 1, start, &lo, &hi);
        memset(dst, pad, (size_t)lo * 4);
        memset(dst + (size_t)hi * 4, pad, (size_t)(cols - hi) * 4);
        c = lo;
#if defined(VDLA_X86)
        if (src[0] && src[1] && src[2] && src[3]) {
            const __m128i f = _mm_set1_epi8((char)flip);
            for (; c + 16 <= hi; c += 16) {
                __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[0] + c + start)), f);
                __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[1] + c + start)), f);
                __m128i e = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[2] + c + start)), f);
                __m128i d = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[3] + c + start)), f);
                __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
                __m128i ed0 = _mm_unpacklo_epi8(e, d), ed1 = _mm_unpackhi_epi8(e, d);
                uint8_t *o = dst + (size_t)c * 4;
                _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi16(ab0, ed0));
                _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(ab0, ed0));
                _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(ab1, ed1));
                _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(ab1, ed1));
            }
        }
#endif
        for (; c < hi; c++)
            for (int l = 0; l < 4; l++)
                dst[c * 4 + l] = (uint8_t)((src[l] ? (uint8_t)src[l][c + start] : 0) ^ pad);
        return;
    }
    vdla_inside(cols, w, stride, start, &lo, &hi);
    memset(dst, pad, (size_t)lo * 4);
    memset(dst + (size_t)hi * 4, pad, (size_t)(cols - hi) * 4);
    for (int l = 0; l < 4; l++) {
        if (!src[l]) {
            for (c = lo; c < hi; c++) dst[c * 4 + l] = pad;
            continue;
        }
        const int8_t *restrict row = src[l] + start;
        for (c = lo; c < hi; c++) dst[c * 4 + l] = (uint8_t)((uint8_t)row[c * stride] ^ pad);
    }
}

/* ---- float math on vectors: exp, erf, tanh (the sequence models' softmax, GELU) --------
 * Branch-free, so gcc keeps them in vectors; within a few float32 ulps of the C library
 * in the ranges they are used in (relative error below 1e-6; the targets' float results
 * are checked within 1e-4 of the float64 reference):
 *   exp: Cephes' expf (x = n ln 2 + r, a degree-5 polynomial in r, 2^n put in the
 *        exponent bits); 0 below -87.3 (where expf is denormal or 0), +inf above 88.7
 *   erf: Eigen's rational approximation on [-4, 4] (outside: +-1)
 *   tanh: sign(x) (1 - 2 / (exp(2|x|) + 1)), absolute error below 1e-7
 * Their polynomials are multiply-adds (`vfN_fma`: one rounding each where the machine
 * has FMA, which the -std=c11 build does not contract from a * b + c itself): half the
 * instructions of a multiply and an add, and the float attention 1.08x faster on
 * ViT-tiny and 1.04x on BERT-base (Intel Xeon with AMX, 2 threads). */
#define VDLA_MATH(N)                                                                         \
VDLA_INLINE vf##N vf##N##_exp(vf##N x) {                                                     \
    const vi##N under = x < -87.33654475f;                                                   \
    x = vf##N##_min(vf##N##_max(x, vf##N##_bcast(-87.33654475f)), vf##N##_bcast(88.7f));     \
    vf##N f = x * 1.44269504088896341f + 0.5f;                                               \
    vi##N n = __builtin_convertvector(f, vi##N);                                             \
    n += (vi##N)(__builtin_convertvector(n, vf##N) > f); /* truncation to floor */           \
    const vf##N nf = __builtin_convertvector(n, vf##N);                                      \
    vf##N r = vf##N##_fma(nf, vf##N##_bcast(-0.693359375f), x);                              \
    r = vf##N##_fma(nf, vf##N##_bcast(2.12194440e-4f), r);                                   \
    vf##N y = vf##N##_bcast(1.9875691500E-4f);                                               \
    y = vf##N##_fma(y, r, vf##N##_bcast(1.3981999507E-3f));                                  \
    y = vf##N##_fma(y, r, vf##N##_bcast(8.3334519073E-3f));                                  \
    y = vf##N##_fma(y, r, vf##N##_bcast(4.1665795894E-2f));                                  \
    y = vf##N##_fma(y, r, vf##N##_bcast(1.6666665459E-1f));                                  \
    y = vf##N##_fma(y, r, vf##N##_bcast(5.0000001201E-1f));                                  \
    y = vf##N##_fma(y, r * r, r + 1.0f);                                                     \
    y = y * (vf##N)((n + 127) << 23);                                                        \
    return (vf##N)((vi##N)y & ~under);                                                       \
}                                                                                            \
VDLA_INLINE vf##N vf##N##_erf(vf##N a) {                                                     \
    const vf##N x = vf##N##_min(vf##N##_max(a, vf##N##_bcast(-4.0f)), vf##N##_bcast(4.0f));  \
    const vf##N x2 = x * x;                                                                  \
    vf##N p = vf##N##_fma(x2, vf##N##_bcast(-2.72614225801306e-10f),                          \
                          vf##N##_bcast(2.77068142495902e-08f));                             \
    p = vf##N##_fma(p, x2, vf##N##_bcast(-2.10102402082508e-06f));                           \
    p = vf##N##_fma(p, x2, vf##N##_bcast(-5.69250639462346e-05f));                           \
    p = vf##N##_fma(p, x2, vf##N##_bcast(-7.34990630326855e-04f));                           \
    p = vf##N##_fma(p, x2, vf##N##_bcast(-2.95459980854025e-03f));                           \
    p = vf##N##_fma(p, x2, vf##N##_bcast(-1.60960333262415e-02f));                           \
    p = p * x;                                                                               \
    vf##N q = vf##N##_fma(x2, vf##N##_bcast(-1.45660718464996e-05f),                          \
                          vf##N##_bcast(-2.13374055278905e-04f));                            \
    q = vf##N##_fma(q, x2, vf##N##_bcast(-1.68282697438203e-03f));                           \
    q = vf##N##_fma(q, x2, vf##N##_bcast(-7.37332916720468e-03f));                           \
    q = vf##N##_fma(q, x2, vf##N##_bcast(-1.42647390514189e-02f));                           \
    return p / q;                                                                            \
}                                                                                            \
VDLA_INLINE vf##N vf##N##_tanh(vf##N x) {                                                    \
    const vi##N sign = (vi##N)x & (vi##N){VDLA_REP##N((int32_t)0x80000000)};                 \
    const vf##N ax = (vf##N)((vi##N)x & ~sign);                                              \
    const vf##N t = 1.0f - 2.0f / (vf##N##_exp(ax + ax) + 1.0f);                             \
    return (vf##N)((vi##N)t | sign);                                                         \
}
VDLA_MATH(16)
VDLA_MATH(8)

/* ---- errors a kernel reports (runtime.c): a bad index read from a tensor ---------------- */
void vdla_fail(const char *prefix, long long value, const char *suffix);

/* ---- AMX tiles (the amx instruction set's int8 GEMMs: amx.py) -------------------------
 * Eight tile registers tmm0-7 of up to 16 rows x 64 bytes. The kernels configure every
 * tile as 16 rows x 64 bytes (vdla_amx_configure, once per call and thread) and compute
 * blocks of up to 2 x 2 tiles of C (32 x 32 int32) with tdpbssd: C[m][n] += the signed
 * products of A's row m (64 bytes: k) and B's tile row k / 4, bytes 4n..4n+3 (the packed
 * [K / 4][N][4] layout). Built with VDLA_AMX_MODEL the same calls run on the software
 * model below instead of the instructions. */
#if defined(VDLA_AMX_MODEL) || (defined(VDLA_X86) && defined(__AMX_TILE__) && defined(__AMX_INT8__))
#define VDLA_AMX 1

#if defined(VDLA_AMX_MODEL)
/* A software model of the AMX tiles, for testing the tile kernels on machines without
 * AMX: the intrinsics the kernels use, by the same names, on a per-thread array of eight
 * tiles, following the semantics Intel documents (the intrinsics guide's operations):
 *   _tile_loadconfig  palette 1 (0: the INIT state, every tile unconfigured), the reserved
 *                     bytes zero, each tile's rows <= 16 and colsb <= 64, both zero or
 *                     neither. The tile data is left as a marker pattern (0xA5): a kernel
 *                     that reads a tile it did not zero or load fails its tests;
 *   _tile_zero        the whole tile 0;
 *   _tile_loadd       rows x colsb bytes from base + row * stride, the rest of the tile 0;
 *   _tile_dpbssd      dst[m][n] += sum over k < src1.colsb / 4 and i < 4 of
 *                     src1[m][4k + i] * src2[k][4n + i], signed bytes, int32 sums that wrap
 *                     (computed on uint32), for m < dst.rows, n < dst.colsb / 4; its shapes
 *                     must agree (dst.rows == src1.rows, src1.colsb / 4 == src2.rows,
 *                     dst.colsb == src2.colsb, each colsb a multiple of 4) and the three
 *                     tiles differ, else the instruction faults;
 *   _tile_dpbf16ps    dst[m][n] (float) += src1[m][2k] * src2[k][2n], then
 *                     += src1[m][2k + 1] * src2[k][2n + 1], for k < src1.colsb / 4 in
 *                     order: bfloat16 operands widened to float (a denormal read as 0),
 *                     each product exact in float, each sum rounded to nearest even and
 *                     a denormal sum flushed to 0 (MXCSR ignored); shapes as tdpbssd's;
 *   _tile_stored      rows x colsb bytes to base + row * stride;
 *   _tile_release     back to the INIT state.
 * What the hardware would fault on (#GP, #UD) is reported through vdla_fail (the kernel's
 * caller raises it) and the instruction is skipped. It checks the kernels' layouts and
 * edges, bit for bit; it says nothing about their speed. */
typedef struct {
    int rows, colsb;
    uint8_t data[16][64];
} vdla_amx_tile;
static _Thread_local struct { int palette; vdla_amx_tile tile[8]; } vdla_amx_model;

static inline void vdla_amx_fault(int tile, const char *what) {
    vdla_fail("the AMX model faulted at tile ", tile, what);
}

static inline void vdla_amx_model_loadconfig(const void *config) {
    const uint8_t *c = (const uint8_t *)config;
    int bad = c[0] > 1;
    for (int i = 2; i < 16; i++) bad |= c[i] != 0;
    for (int i = 32; i < 48; i++) bad |= c[i] != 0;
    for (int i = 56; i < 64; i++) bad |= c[i] != 0;
    for (int t = 0; t < 8 && !bad; t++) {
        const int colsb = c[16 + 2 * t] | c[17 + 2 * t] << 8, rows = c[48 + t];
        bad |= colsb > 64 || rows > 16 || (colsb == 0) != (rows == 0);
    }
    if (bad) { vdla_amx_fault(-1, ": an invalid tile configuration (#GP)"); return; }
    vdla_amx_model.palette = c[0];
    for (int t = 0; t < 8; t++) {
        vdla_amx_tile *x = &vdla_amx_model.tile[t];
        x->colsb = c[0] ? c[16 + 2 * t] | c[17 + 2 * t] << 8 : 0;
        x->rows = c[0] ? c[48 + t] : 0;
        memset(x->data, c[0] ? 0xA5 : 0, sizeof x->data);
    }
}

static inline void vdla_amx_model_release(void) {
    memset(&vdla_amx_model, 0, sizeof vdla_amx_model);
}

/* The tile `t` of an instruction, or NULL (reported) when the tiles are not configured or
   `t` is not one of them. */
static inline vdla_amx_tile *vdla_amx_model_tile(int t) {
    if (!vdla_amx_model.palette || t < 0 || t > 7 || !vdla_amx_model.tile[t].rows) {
        vdla_amx_fault(t, ": the tile is not configured (#UD)");
        return NULL;
    }
    return &vdla_amx_model.tile[t];
}

static inline void vdla_amx_model_zero(int t) {
    vdla_amx_tile *x = vdla_amx_model_tile(t);
    if (x) memset(x->data, 0, sizeof x->data);
}

static inline void vdla_amx_model_loadd(int t, const void *base, long stride) {
    vdla_amx_tile *x = vdla_amx_model_tile(t);
    if (!x) return;
    memset(x->data, 0, sizeof x->data);
    for (int r = 0; r < x->rows; r++)
        memcpy(x->data[r], (const uint8_t *)base + (ptrdiff_t)r * stride, (size_t)x->colsb);
}

static inline void vdla_amx_model_stored(int t, void *base, long stride) {
    vdla_amx_tile *x = vdla_amx_model_tile(t);
    if (!x) return;
    for (int r = 0; r < x->rows; r++)
        memcpy((uint8_t *)base + (ptrdiff_t)r * stride, x->data[r], (size_t)x->colsb);
}

/* The tiles of a dot-product instruction (dst d += src1 s1 times src2 s2), or 0 (reported,
   the instruction skipped) where the hardware faults: a tile not configured, one used
   twice, or shapes that do not fit together. */
static inline int vdla_amx_model_dot(int d, int s1, int s2, vdla_amx_tile **c,
                                     vdla_amx_tile **a, vdla_amx_tile **b, const char *what) {
    *c = vdla_amx_model_tile(d), *a = vdla_amx_model_tile(s1), *b = vdla_amx_model_tile(s2);
    if (!*c || !*a || !*b) return 0;
    if (d == s1 || d == s2 || s1 == s2 || (*c)->rows != (*a)->rows
            || (*a)->colsb / 4 != (*b)->rows || (*c)->colsb != (*b)->colsb
            || ((*c)->colsb | (*a)->colsb | (*b)->colsb) % 4) {
        vdla_amx_fault(d, what);
        return 0;
    }
    return 1;
}

static inline void vdla_amx_model_dpbssd(int d, int s1, int s2) {
    vdla_amx_tile *c, *a, *b;
    if (!vdla_amx_model_dot(d, s1, s2, &c, &a, &b,
                            ": tdpbssd's tiles do not fit together (#UD)")) return;
    for (int m = 0; m < c->rows; m++)
        for (int n = 0; n < c->colsb / 4; n++) {
            uint32_t sum;
            memcpy(&sum, c->data[m] + 4 * n, 4);
            for (int k = 0; k < a->colsb / 4; k++)
                for (int i = 0; i < 4; i++)
                    sum += (uint32_t)((int32_t)(int8_t)a->data[m][4 * k + i]
                                      * (int32_t)(int8_t)b->data[k][4 * n + i]);
            memcpy(c->data[m] + 4 * n, &sum, 4);
        }
}

/* A float's denormals as 0 (the tile float ops' DAZ and FTZ). */
static inline float vdla_amx_flush(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7f800000u)) u &= 0x80000000u;
    memcpy(&f, &u, 4);
    return f;
}

/* The bfloat16 at p (two bytes, little-endian) as a float. */
static inline float vdla_amx_bf16(const uint8_t *p) {
    const uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return vdla_amx_flush(f);
}

static inline void vdla_amx_model_dpbf16ps(int d, int s1, int s2) {
    vdla_amx_tile *c, *a, *b;
    if (!vdla_amx_model_dot(d, s1, s2, &c, &a, &b,
                            ": tdpbf16ps's tiles do not fit together (#UD)")) return;
    for (int m = 0; m < c->rows; m++)
        for (int n = 0; n < c->colsb / 4; n++) {
            float sum;
            memcpy(&sum, c->data[m] + 4 * n, 4);
            for (int k = 0; k < a->colsb / 4; k++)
                for (int i = 0; i < 2; i++) {
                    const float product = vdla_amx_bf16(a->data[m] + 4 * k + 2 * i)
                                          * vdla_amx_bf16(b->data[k] + 4 * n + 2 * i);
                    sum = vdla_amx_flush(sum + product);
                }
            memcpy(c->data[m] + 4 * n, &sum, 4);
        }
}

/* The intrinsics' names (gcc's immintrin.h defines them as macros or functions when it
   targets AMX; these names shadow both). */
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbssd
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) vdla_amx_model_loadconfig(config)
#define _tile_release() vdla_amx_model_release()
#define _tile_zero(t) vdla_amx_model_zero(t)
#define _tile_loadd(t, base, stride) vdla_amx_model_loadd(t, base, stride)
#define _tile_stored(t, base, stride) vdla_amx_model_stored(t, base, stride)
#define _tile_dpbssd(d, s1, s2) vdla_amx_model_dpbssd(d, s1, s2)
#define _tile_dpbf16ps(d, s1, s2) vdla_amx_model_dpbf16ps(d, s1, s2)

VDLA_INLINE int vdla_amx_ready(void) { return 1; }
#else
/* 1 when the OS grants this process the tile state (runtime.c: asked once); else 0, the
   refusal reported through vdla_fail. */
int vdla_amx_ready(void);
#endif

/* Every tile 16 rows x 64 bytes (palette 1), on the calling thread. */
VDLA_INLINE void vdla_amx_configure(void) {
    unsigned char config[64] __attribute__((aligned(64)));
    memset(config, 0, sizeof config);
    config[0] = 1;
    for (int t = 0; t < 8; t++) { config[16 + 2 * t] = 64; config[48 + t] = 16; }
    _tile_loadconfig(config);
}

/* C's block of rt x ct tiles (rt, ct: 1 or 2, constants where it is inlined) into c (32 x
   32 sums, rows of 128 bytes): A's 16 * rt rows at a (rows of lda bytes, zero past K), B
   packed at b (its tile rows ldb bytes apart; the second column tile 64 bytes on), kb
   steps of 64 bytes of k. Tiles 0-3 accumulate, 4-5 hold A, 6-7 B. vdla_amx_block: int8
   operands, int32 sums (tdpbssd); vdla_amx_block_bf16: pairs of bfloat16, float sums
   (tdpbf16ps; the bf16 precision). One body, written once. */
/* The parts of a block: its accumulating tiles zeroed, one step of 64 bytes of k (A's
   rows at a_, B's tile rows at bq), the sums stored to c. */
#define VDLA_AMX_ZERO(rt, ct)                                                               \
    do { _tile_zero(0); if (ct > 1) _tile_zero(1); if (rt > 1) _tile_zero(2);              \
         if (rt > 1 && ct > 1) _tile_zero(3); } while (0)
#define VDLA_AMX_STEP(dot, a_, lda, bq, ldb, rt, ct)                                        \
    do { _tile_loadd(4, a_, lda); if (rt > 1) _tile_loadd(5, (a_) + 16 * (lda), lda);      \
         _tile_loadd(6, bq, ldb); if (ct > 1) _tile_loadd(7, (bq) + 64, ldb);              \
         dot(0, 4, 6); if (ct > 1) dot(1, 4, 7); if (rt > 1) dot(2, 5, 6);                 \
         if (rt > 1 && ct > 1) dot(3, 5, 7); } while (0)
#define VDLA_AMX_STORE(c, rt, ct)                                                           \
    do { _tile_stored(0, c, 128); if (ct > 1) _tile_stored(1, (c) + 16, 128);              \
         if (rt > 1) _tile_stored(2, (c) + 16 * 32, 128);                                  \
         if (rt > 1 && ct > 1) _tile_stored(3, (c) + 16 * 32 + 16, 128); } while (0)

#define VDLA_AMX_BLOCK(name, elem, sum, dot)                                                \
VDLA_INLINE void name(const elem *a_, const size_t lda, const elem *b_, const size_t ldb,  \
                      const int kb, const int rt, const int ct, sum *c) {                  \
    const int8_t *a = (const int8_t *)a_, *b = (const int8_t *)b_;                         \
    VDLA_AMX_ZERO(rt, ct);                                                                  \
    for (int q = 0; q < kb; q++) {                                                          \
        const int8_t *bq = b + (size_t)q * 16 * ldb;                                        \
        VDLA_AMX_STEP(dot, a + (size_t)q * 64, lda, bq, ldb, rt, ct);                       \
    }                                                                                       \
    VDLA_AMX_STORE(c, rt, ct);                                                              \
}

VDLA_AMX_BLOCK(vdla_amx_block, int8_t, int32_t, _tile_dpbssd)

/* vdla_amx_block for a convolution whose im2col rows are read in place: A's rows are
   pixels of a zero-padded NHWC image, lda bytes apart (the stride times the channels),
   tap t's first row at a + off[t], each tap cb steps of 64 channels; B packed as above,
   the taps' steps in order. A row tile past the image's last pixels reads what follows
   (the caller's slack); its sums are not used. */
VDLA_INLINE void vdla_amx_taps_block(const int8_t *a, const size_t lda, const long *off,
                                     const int taps, const int cb, const int8_t *b,
                                     const size_t ldb, const int rt, const int ct,
                                     int32_t *c) {
    VDLA_AMX_ZERO(rt, ct);
    for (int t = 0; t < taps; t++)
        for (int s = 0; s < cb; s++)
            VDLA_AMX_STEP(_tile_dpbssd, a + off[t] + 64 * s, lda,
                          b + (size_t)(t * cb + s) * 16 * ldb, ldb, rt, ct);
    VDLA_AMX_STORE(c, rt, ct);
}
#if defined(VDLA_AMX_MODEL) || defined(__AMX_BF16__)
VDLA_AMX_BLOCK(vdla_amx_block_bf16, uint16_t, float, _tile_dpbf16ps)
#endif
#endif /* VDLA_AMX */

/* float to bfloat16, rounded to nearest even (a NaN stays a quiet NaN): what the bf16
   precision's kernels store their operands in (the reference rounds the same way). */
VDLA_INLINE uint16_t vdla_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

#endif /* VDLA_CPU_H */
