/*
 * powa.h - the stored form of a priority: p ** alpha as float32, computed the
 * way docs/semantics.md ("Stored priorities") defines it, so that the
 * pure-Python reference (exreplay/reference.py, _leaf) repeats it bit for bit.
 *
 *   p == 0          -> 0 (for every alpha: priority 0 is never drawn)
 *   alpha == 0      -> 1
 *   alpha == 1      -> p
 *   alpha == 0.5    -> sqrt(p)
 *   otherwise       -> 2 ** (alpha * log2 p), from the two short series below
 *   then clamped to float32's largest value and rounded to float32.
 *
 * The general case uses IEEE double +, -, *, / only (the project builds with
 * -std=c11, so no contraction into fused multiply-adds) and exact bit
 * manipulation, so Python floats give the same bits. Its relative error is
 * about 1e-14 before the float32 rounding: it returns the correctly rounded
 * float32 of p ** alpha except when p ** alpha lies within ~1e-14 of a
 * float32 rounding boundary (then the neighbour). It exists because libm's
 * pow took about 10 ns a call, a quarter of set_priority's time; the loop
 * below has no calls and no branches, so the compiler vectorizes it, and
 * the lanes below (SSE2, AVX2, AVX-512F) repeat it lane by lane.
 */
#ifndef EXR_POWA_H
#define EXR_POWA_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline double exr_bits_to_double(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static inline uint64_t exr_double_to_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* The general case for one p > 0 (finite, normal: p >= DBL_MIN) and alpha
 * (finite, > 0), before the float32 clamp. Step by step as the reference:
 *   m, e = frexp(p)                       m in [0.5, 1), exact
 *   if m < sqrt(0.5): m, e = 2m, e - 1    m in [sqrt(0.5), sqrt(2))
 *   s = (m - 1) / (m + 1); z = s * s
 *   l = s * P(z), P(z) = K0 + K1 z + ... + K7 z^7      log2(m), K_k = 2 / (ln 2 (2k + 1))
 *   y = alpha * (e + l), clamped to [-160, 130]
 *   n = round-half-even(y) (as (y + 1.5 * 2^52) - 1.5 * 2^52); f = y - n
 *   r = Q(f) = E0 + E1 f + ... + E11 f^11               2^f, E_k = (ln 2)^k / k!
 *   result = r * 2^n                                     exact (no overflow or underflow in double)
 * P and Q by Estrin's scheme (pairs, then pairs of pairs: EXR_POW_P/Q below),
 * whose dependency chains are a third as long as Horner's: the series are
 * latency-bound. A subnormal p is scaled by 2^64 first (exr_pow_one): frexp's
 * m and e. */
#define EXR_K0 2.8853900817779268
#define EXR_K1 0.9617966939259756
#define EXR_K2 0.5770780163555853
#define EXR_K3 0.4121985831111324
#define EXR_K4 0.3205988979753252
#define EXR_K5 0.2623081892525388
#define EXR_K6 0.22195308321368667
#define EXR_K7 0.19235933878519512
#define EXR_E0 1.0
#define EXR_E1 0.6931471805599453
#define EXR_E2 0.24022650695910072
#define EXR_E3 0.05550410866482158
#define EXR_E4 0.009618129107628477
#define EXR_E5 0.0013333558146428443
#define EXR_E6 0.0001540353039338161
#define EXR_E7 1.5252733804059841e-05
#define EXR_E8 1.321548679014431e-06
#define EXR_E9 1.01780860092397e-07
#define EXR_E10 7.054911620801123e-09
#define EXR_E11 4.4455382718708116e-10
#define EXR_POW_ROUND 6755399441055744.0 /* 1.5 * 2^52 */

/* Estrin, written once for doubles and for SSE2 vectors: ADD, MUL and C
 * (a constant) are the type's operations.
 *   P(z) = ((K0 + K1 z) + (K2 + K3 z) z2) + ((K4 + K5 z) + (K6 + K7 z) z2) z4
 *   Q(f) = (((E0 + E1 f) + (E2 + E3 f) f2) + ((E4 + E5 f) + (E6 + E7 f) f2) f4)
 *          + ((E8 + E9 f) + (E10 + E11 f) f2) f8                          */
#define EXR_POW_P(ADD, MUL, C, z, out)                                                             \
    do {                                                                                           \
        __typeof__(z) z2_ = MUL(z, z), z4_ = MUL(z2_, z2_);                                        \
        __typeof__(z) a0_ = ADD(C(EXR_K0), MUL(C(EXR_K1), z));                                     \
        __typeof__(z) a1_ = ADD(C(EXR_K2), MUL(C(EXR_K3), z));                                     \
        __typeof__(z) a2_ = ADD(C(EXR_K4), MUL(C(EXR_K5), z));                                     \
        __typeof__(z) a3_ = ADD(C(EXR_K6), MUL(C(EXR_K7), z));                                     \
        (out) = ADD(ADD(a0_, MUL(a1_, z2_)), MUL(ADD(a2_, MUL(a3_, z2_)), z4_));                   \
    } while (0)
#define EXR_POW_Q(ADD, MUL, C, f, out)                                                             \
    do {                                                                                           \
        __typeof__(f) f2_ = MUL(f, f), f4_ = MUL(f2_, f2_), f8_ = MUL(f4_, f4_);                   \
        __typeof__(f) c0_ = ADD(C(EXR_E0), MUL(C(EXR_E1), f));                                     \
        __typeof__(f) c1_ = ADD(C(EXR_E2), MUL(C(EXR_E3), f));                                     \
        __typeof__(f) c2_ = ADD(C(EXR_E4), MUL(C(EXR_E5), f));                                     \
        __typeof__(f) c3_ = ADD(C(EXR_E6), MUL(C(EXR_E7), f));                                     \
        __typeof__(f) c4_ = ADD(C(EXR_E8), MUL(C(EXR_E9), f));                                     \
        __typeof__(f) c5_ = ADD(C(EXR_E10), MUL(C(EXR_E11), f));                                   \
        __typeof__(f) d0_ = ADD(c0_, MUL(c1_, f2_));                                               \
        __typeof__(f) d1_ = ADD(c2_, MUL(c3_, f2_));                                               \
        __typeof__(f) d2_ = ADD(c4_, MUL(c5_, f2_));                                               \
        (out) = ADD(ADD(d0_, MUL(d1_, f4_)), MUL(d2_, f8_));                                       \
    } while (0)
#define EXR_DADD(a, b) ((a) + (b))
#define EXR_DMUL(a, b) ((a) * (b))
#define EXR_DC(c) (c)

static inline double exr_pow_general(double p, double alpha, double ebias)
{
    uint64_t u = exr_double_to_bits(p);
    double e = (exr_bits_to_double((u >> 52) | 0x4330000000000000ULL) - 4503599627371518.0) - ebias;
    double m = exr_bits_to_double((u & 0x000fffffffffffffULL) | 0x3fe0000000000000ULL);
    if (m < 0.7071067811865476) {
        m = m + m;
        e = e - 1.0;
    }
    double s = (m - 1.0) / (m + 1.0), z = s * s, pz, r;
    EXR_POW_P(EXR_DADD, EXR_DMUL, EXR_DC, z, pz);
    double y = alpha * (e + s * pz);
    y = y > 130.0 ? 130.0 : y;
    y = y < -160.0 ? -160.0 : y;
    double t = y + EXR_POW_ROUND;
    double f = y - (t - EXR_POW_ROUND);
    EXR_POW_Q(EXR_DADD, EXR_DMUL, EXR_DC, f, r);
    /* t's low bits hold n (two's complement): 2^n from its exponent field */
    return r * exr_bits_to_double((exr_double_to_bits(t) + 1023) << 52);
}

#if defined(__SSE2__)
/* Two at a time: the same operations in the same order as exr_pow_general
 * (min/max for the clamps: y is never NaN), so the same bits. */
static inline __m128d exr_pow_general2(__m128d pv, __m128d av)
{
    const __m128i mant = _mm_set1_epi64x(0x000fffffffffffffLL);
    __m128i u = _mm_castpd_si128(pv);
    __m128d e = _mm_sub_pd(
        _mm_castsi128_pd(_mm_or_si128(_mm_srli_epi64(u, 52), _mm_set1_epi64x(0x4330000000000000LL))),
        _mm_set1_pd(4503599627371518.0));
    __m128d m = _mm_castsi128_pd(_mm_or_si128(_mm_and_si128(u, mant), _mm_set1_epi64x(0x3fe0000000000000LL)));
    __m128d lo = _mm_cmplt_pd(m, _mm_set1_pd(0.7071067811865476));
    m = _mm_add_pd(m, _mm_and_pd(lo, m));
    e = _mm_sub_pd(e, _mm_and_pd(lo, _mm_set1_pd(1.0)));
    const __m128d one = _mm_set1_pd(1.0);
    __m128d s = _mm_div_pd(_mm_sub_pd(m, one), _mm_add_pd(m, one));
    __m128d z = _mm_mul_pd(s, s), pz, r;
    EXR_POW_P(_mm_add_pd, _mm_mul_pd, _mm_set1_pd, z, pz);
    __m128d y = _mm_mul_pd(av, _mm_add_pd(e, _mm_mul_pd(s, pz)));
    y = _mm_max_pd(_mm_min_pd(y, _mm_set1_pd(130.0)), _mm_set1_pd(-160.0));
    __m128d t = _mm_add_pd(y, _mm_set1_pd(EXR_POW_ROUND));
    __m128d f = _mm_sub_pd(y, _mm_sub_pd(t, _mm_set1_pd(EXR_POW_ROUND)));
    EXR_POW_Q(_mm_add_pd, _mm_mul_pd, _mm_set1_pd, f, r);
    __m128d scale = _mm_castsi128_pd(
        _mm_slli_epi64(_mm_add_epi64(_mm_castpd_si128(t), _mm_set1_epi64x(1023)), 52));
    return _mm_min_pd(_mm_mul_pd(r, scale), _mm_set1_pd(FLT_MAX));
}

/* Eight at a time, four independent chains (the series are latency-bound);
 * 0 if one of them is not a normal positive number. */
static inline int exr_pow_general8(const double *p, double alpha, float *out)
{
    __m128d a = _mm_loadu_pd(p), b = _mm_loadu_pd(p + 2);
    __m128d c = _mm_loadu_pd(p + 4), d = _mm_loadu_pd(p + 6);
    const __m128d tiny = _mm_set1_pd(DBL_MIN);
    __m128d ok = _mm_and_pd(_mm_and_pd(_mm_cmpge_pd(a, tiny), _mm_cmpge_pd(b, tiny)),
                            _mm_and_pd(_mm_cmpge_pd(c, tiny), _mm_cmpge_pd(d, tiny)));
    if (_mm_movemask_pd(ok) != 3)
        return 0;
    __m128d av = _mm_set1_pd(alpha);
    a = exr_pow_general2(a, av);
    b = exr_pow_general2(b, av);
    c = exr_pow_general2(c, av);
    d = exr_pow_general2(d, av);
    _mm_storeu_ps(out, _mm_movelh_ps(_mm_cvtpd_ps(a), _mm_cvtpd_ps(b)));
    _mm_storeu_ps(out + 4, _mm_movelh_ps(_mm_cvtpd_ps(c), _mm_cvtpd_ps(d)));
    return 1;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__) && defined(__SSE2__)
#define EXR_POW_AVX2 1
#include <immintrin.h>
/* The same with 4 lanes (AVX2 for the 64-bit integer operations; no FMA:
 * multiplications and additions stay separate, so the bits are those of
 * the SSE2 and scalar paths). Called only where the CPU has AVX2. */
__attribute__((target("avx2"))) static inline __m256d exr_pow_general4v(__m256d pv, __m256d av)
{
    __m256i u = _mm256_castpd_si256(pv);
    __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(
                                  _mm256_srli_epi64(u, 52), _mm256_set1_epi64x(0x4330000000000000LL))),
                              _mm256_set1_pd(4503599627371518.0));
    __m256d m = _mm256_castsi256_pd(
        _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi64x(0x000fffffffffffffLL)),
                        _mm256_set1_epi64x(0x3fe0000000000000LL)));
    __m256d lo = _mm256_cmp_pd(m, _mm256_set1_pd(0.7071067811865476), _CMP_LT_OQ);
    m = _mm256_add_pd(m, _mm256_and_pd(lo, m));
    e = _mm256_sub_pd(e, _mm256_and_pd(lo, _mm256_set1_pd(1.0)));
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d s = _mm256_div_pd(_mm256_sub_pd(m, one), _mm256_add_pd(m, one));
    __m256d z = _mm256_mul_pd(s, s), pz, r;
    EXR_POW_P(_mm256_add_pd, _mm256_mul_pd, _mm256_set1_pd, z, pz);
    __m256d y = _mm256_mul_pd(av, _mm256_add_pd(e, _mm256_mul_pd(s, pz)));
    y = _mm256_max_pd(_mm256_min_pd(y, _mm256_set1_pd(130.0)), _mm256_set1_pd(-160.0));
    __m256d t = _mm256_add_pd(y, _mm256_set1_pd(EXR_POW_ROUND));
    __m256d f = _mm256_sub_pd(y, _mm256_sub_pd(t, _mm256_set1_pd(EXR_POW_ROUND)));
    EXR_POW_Q(_mm256_add_pd, _mm256_mul_pd, _mm256_set1_pd, f, r);
    __m256d scale = _mm256_castsi256_pd(
        _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x(1023)), 52));
    return _mm256_min_pd(_mm256_mul_pd(r, scale), _mm256_set1_pd(FLT_MAX));
}

/* Sixteen at a time, four chains of 4; 0 if one is not a normal positive number. */
__attribute__((target("avx2"))) static int exr_pow_general16(const double *p, double alpha,
                                                             float *out)
{
    __m256d a = _mm256_loadu_pd(p), b = _mm256_loadu_pd(p + 4);
    __m256d c = _mm256_loadu_pd(p + 8), d = _mm256_loadu_pd(p + 12);
    const __m256d tiny = _mm256_set1_pd(DBL_MIN);
    __m256d ok = _mm256_and_pd(
        _mm256_and_pd(_mm256_cmp_pd(a, tiny, _CMP_GE_OQ), _mm256_cmp_pd(b, tiny, _CMP_GE_OQ)),
        _mm256_and_pd(_mm256_cmp_pd(c, tiny, _CMP_GE_OQ), _mm256_cmp_pd(d, tiny, _CMP_GE_OQ)));
    if (_mm256_movemask_pd(ok) != 15)
        return 0;
    __m256d av = _mm256_set1_pd(alpha);
    a = exr_pow_general4v(a, av);
    b = exr_pow_general4v(b, av);
    c = exr_pow_general4v(c, av);
    d = exr_pow_general4v(d, av);
    _mm_storeu_ps(out, _mm256_cvtpd_ps(a));
    _mm_storeu_ps(out + 4, _mm256_cvtpd_ps(b));
    _mm_storeu_ps(out + 8, _mm256_cvtpd_ps(c));
    _mm_storeu_ps(out + 12, _mm256_cvtpd_ps(d));
    return 1;
}

/* The same with 8 lanes (AVX-512F): the operations of exr_pow_general4v on
 * the same operands lane by lane, the comparison into a mask register and
 * the two adjustments it selects as masked operations (which leave a lane
 * as it is where the AVX2 code adds or subtracts 0: the same bits). Called
 * only where the CPU has AVX-512F. */
__attribute__((target("avx512f"))) static inline __m512d exr_pow_general8v(__m512d pv, __m512d av)
{
    __m512i u = _mm512_castpd_si512(pv);
    __m512d e = _mm512_sub_pd(_mm512_castsi512_pd(_mm512_or_si512(
                                  _mm512_srli_epi64(u, 52), _mm512_set1_epi64(0x4330000000000000LL))),
                              _mm512_set1_pd(4503599627371518.0));
    __m512d m = _mm512_castsi512_pd(
        _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi64(0x000fffffffffffffLL)),
                        _mm512_set1_epi64(0x3fe0000000000000LL)));
    __mmask8 lo = _mm512_cmp_pd_mask(m, _mm512_set1_pd(0.7071067811865476), _CMP_LT_OQ);
    m = _mm512_mask_add_pd(m, lo, m, m);
    const __m512d one = _mm512_set1_pd(1.0);
    e = _mm512_mask_sub_pd(e, lo, e, one);
    __m512d s = _mm512_div_pd(_mm512_sub_pd(m, one), _mm512_add_pd(m, one));
    __m512d z = _mm512_mul_pd(s, s), pz, r;
    EXR_POW_P(_mm512_add_pd, _mm512_mul_pd, _mm512_set1_pd, z, pz);
    __m512d y = _mm512_mul_pd(av, _mm512_add_pd(e, _mm512_mul_pd(s, pz)));
    y = _mm512_max_pd(_mm512_min_pd(y, _mm512_set1_pd(130.0)), _mm512_set1_pd(-160.0));
    __m512d t = _mm512_add_pd(y, _mm512_set1_pd(EXR_POW_ROUND));
    __m512d f = _mm512_sub_pd(y, _mm512_sub_pd(t, _mm512_set1_pd(EXR_POW_ROUND)));
    EXR_POW_Q(_mm512_add_pd, _mm512_mul_pd, _mm512_set1_pd, f, r);
    __m512d scale = _mm512_castsi512_pd(
        _mm512_slli_epi64(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_set1_epi64(1023)), 52));
    return _mm512_min_pd(_mm512_mul_pd(r, scale), _mm512_set1_pd(FLT_MAX));
}

/* Thirty-two at a time, four chains of 8; 0 if one is not a normal
 * positive number. */
__attribute__((target("avx512f"))) static int exr_pow_general32(const double *p, double alpha,
                                                               float *out)
{
    __m512d v[4];
    const __m512d tiny = _mm512_set1_pd(DBL_MIN);
    __mmask8 ok = 0xFF;
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_loadu_pd(p + 8 * i);
        ok &= _mm512_cmp_pd_mask(v[i], tiny, _CMP_GE_OQ);
    }
    if (ok != 0xFF)
        return 0;
    __m512d av = _mm512_set1_pd(alpha);
    for (int i = 0; i < 4; i++)
        v[i] = exr_pow_general8v(v[i], av);
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(out + 8 * i, _mm512_cvtpd_ps(v[i]));
    return 1;
}

/* name(): whether the CPU has feature (a string for
 * __builtin_cpu_supports), asked once per translation unit */
#define EXR_CPU_HAS(name, feature)                                                                 \
    static inline int name(void)                                                                   \
    {                                                                                              \
        static int have = -1; /* a benign race: every thread computes the same */                 \
        int h = __atomic_load_n(&have, __ATOMIC_RELAXED);                                          \
        if (h < 0) {                                                                               \
            __builtin_cpu_init();                                                                  \
            h = __builtin_cpu_supports(feature) ? 1 : 0;                                           \
            __atomic_store_n(&have, h, __ATOMIC_RELAXED);                                          \
        }                                                                                          \
        return h;                                                                                  \
    }
EXR_CPU_HAS(exr_have_avx2, "avx2")
EXR_CPU_HAS(exr_have_avx512f, "avx512f")
#endif

static inline float exr_leaf_clamp(double v) { return v > FLT_MAX ? FLT_MAX : (float)v; }

/* The general case of one priority q >= 0. */
static inline float exr_pow_one(double q, double alpha)
{
    if (!(q > 0))
        return 0.0f;
    if (q < DBL_MIN)
        return exr_leaf_clamp(exr_pow_general(q * 18446744073709551616.0, alpha, 64.0)); /* 2^64 */
    return exr_leaf_clamp(exr_pow_general(q, alpha, 0.0));
}

/* out[k] = the stored form of p[k * stride] ** alpha, for k < count
 * (p finite and >= 0, alpha finite and >= 0), the general case with at
 * most the lanes given: 2 AVX-512's 8 (32 at a time), 1 AVX2's 4 (16 at a
 * time), 0 SSE2's 2 (8 at a time), each only where the CPU has it; every
 * width gives the same bits (tests/c/test_core.c compares them). */
static inline void exr_pow_leaves_lanes(const double *p, size_t stride, size_t count,
                                        double alpha, float *out, int lanes)
{
    if (alpha == 0.0) {
        for (size_t k = 0; k < count; k++)
            out[k] = p[k * stride] > 0 ? 1.0f : 0.0f;
    } else if (alpha == 1.0) {
        for (size_t k = 0; k < count; k++)
            out[k] = exr_leaf_clamp(p[k * stride]);
    } else if (alpha == 0.5) {
        for (size_t k = 0; k < count; k++)
            out[k] = exr_leaf_clamp(sqrt(p[k * stride]));
    } else {
        size_t k = 0;
        (void)lanes;
#if defined(EXR_POW_AVX2)
        if (lanes >= 2 && stride == 1 && count >= 32 && exr_have_avx512f())
            for (; k + 32 <= count; k += 32)
                if (!exr_pow_general32(p + k, alpha, out + k))
                    for (size_t j = k; j < k + 32; j++)
                        out[j] = exr_pow_one(p[j], alpha);
        if (lanes >= 1 && stride == 1 && count - k >= 16 && exr_have_avx2())
            for (; k + 16 <= count; k += 16)
                if (!exr_pow_general16(p + k, alpha, out + k))
                    for (size_t j = k; j < k + 16; j++)
                        out[j] = exr_pow_one(p[j], alpha);
#endif
#if defined(__SSE2__)
        if (stride == 1)
            for (; k + 8 <= count; k += 8)
                if (!exr_pow_general8(p + k, alpha, out + k))
                    for (size_t j = k; j < k + 8; j++)
                        out[j] = exr_pow_one(p[j], alpha);
#endif
        for (; k < count; k++)
            out[k] = exr_pow_one(p[k * stride], alpha);
    }
}

/* The same with the widest lanes the CPU has. */
static inline void exr_pow_leaves(const double *p, size_t stride, size_t count, double alpha,
                                  float *out)
{
    exr_pow_leaves_lanes(p, stride, count, alpha, out, 2);
}

static inline float exr_pow_leaf(double p, double alpha)
{
    float v;
    exr_pow_leaves(&p, 0, 1, alpha, &v);
    return v;
}

#endif
