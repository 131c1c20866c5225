"""Philox4x32-10 counter-based random numbers: the CUDA kernels and a NumPy reference.

Each call draws ``ceil(n / per_block)`` consecutive 128-bit counters starting at the
generator's device-held position; every counter yields four 32-bit words, turned into
``per_block`` outputs. The kernel reads the position once, and the last thread block to
finish advances it (a "last block" counter), so one launch both draws and advances: a
captured call advances the position on every replay, with no host work.

The NumPy functions compute exactly the same words and the same integer-derived outputs, so
tests can compare GPU results bitwise against an independent implementation.
"""

from __future__ import annotations

import numpy as np

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF

#: outputs per 128-bit counter, by kernel family
PER_BLOCK = {"u32": 4, "u64": 2}

KERNEL_SOURCE = r"""
struct cgrt_u4 { unsigned int x, y, z, w; };

__device__ __forceinline__ cgrt_u4 cgrt_philox(unsigned long long counter,
                                                unsigned long long seed) {
    unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32);
    unsigned int c2 = 0u, c3 = 0u;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    #pragma unroll
    for (int round = 0; round < 10; ++round) {
        unsigned int lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        unsigned int lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    cgrt_u4 r = {c0, c1, c2, c3};
    return r;
}

__device__ __forceinline__ float cgrt_u01f(unsigned int u) {        // [0, 1)
    return (float)(u >> 8) * 5.9604644775390625e-08f;
}
__device__ __forceinline__ float cgrt_u01h(unsigned int u) {        // [0, 1) in float16 steps
    return (float)(u >> 21) * 4.8828125e-04f;
}
__device__ __forceinline__ float cgrt_u01f_open0(unsigned int u) {  // (0, 1]
    return (float)((u >> 8) + 1u) * 5.9604644775390625e-08f;
}
__device__ __forceinline__ double cgrt_u01d(unsigned int a, unsigned int b) {  // [0, 1)
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * 1.1102230246251565e-16;
}
__device__ __forceinline__ double cgrt_u01d_open0(unsigned int a, unsigned int b) {
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6) + 1.0) * 1.1102230246251565e-16;
}

// Read the position once per block; the last block to finish advances it.
#define CGRT_PROLOGUE                                                              \
    __shared__ unsigned long long s_seed, s_base;                                  \
    if (threadIdx.x == 0) { s_seed = state[0]; s_base = state[1]; }              \
    __syncthreads();                                                               \
    const unsigned long long seed = s_seed, base = s_base;                         \
    const long long stride = (long long)gridDim.x * blockDim.x;

#define CGRT_EPILOGUE                                                              \
    __syncthreads();                                                               \
    if (advance && threadIdx.x == 0) {                                             \
        __threadfence();                                                           \
        unsigned int done = atomicAdd((unsigned int*)&state[2], 1u);               \
        if (done == gridDim.x - 1) {                                               \
            state[1] = base + (unsigned long long)counters;                        \
            state[2] = 0ull;                                                       \
            __threadfence();                                                       \
        }                                                                          \
    }

// kind: 0 uniform [0,1) scaled as x*a+b; 1 normal (Box-Muller) scaled as z*a+b;
// 2 uniform on the 2^-11 grid, so that float16 outputs never round up to 1
// float16 is stored as its bit pattern: converting with PTX avoids depending on cuda_fp16.h
// being reachable by NVRTC.
struct cgrt_half { unsigned short bits; };
template <typename T>
__device__ __forceinline__ T cgrt_from_float(float v) { return (T)v; }
template <>
__device__ __forceinline__ cgrt_half cgrt_from_float<cgrt_half>(float v) {
    cgrt_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

template <typename T>
__device__ void cgrt_fill32(unsigned long long* state, T* out, long long n, int kind,
                            float a, float b, int advance) {
    const long long counters = (n + 3) / 4;
    CGRT_PROLOGUE
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < counters;
         j += stride) {
        cgrt_u4 r = cgrt_philox(base + (unsigned long long)j, seed);
        float v[4];
        if (kind == 0) {
            v[0] = cgrt_u01f(r.x); v[1] = cgrt_u01f(r.y);
            v[2] = cgrt_u01f(r.z); v[3] = cgrt_u01f(r.w);
        } else if (kind == 2) {
            v[0] = cgrt_u01h(r.x); v[1] = cgrt_u01h(r.y);
            v[2] = cgrt_u01h(r.z); v[3] = cgrt_u01h(r.w);
        } else {
            float rad0 = sqrtf(-2.0f * logf(cgrt_u01f_open0(r.x)));
            float rad1 = sqrtf(-2.0f * logf(cgrt_u01f_open0(r.z)));
            float s0, c0, s1, c1;
            sincospif(2.0f * cgrt_u01f(r.y), &s0, &c0);
            sincospif(2.0f * cgrt_u01f(r.w), &s1, &c1);
            v[0] = rad0 * c0; v[1] = rad0 * s0; v[2] = rad1 * c1; v[3] = rad1 * s1;
        }
        long long i0 = j * 4;
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (i0 + k < n) out[i0 + k] = cgrt_from_float<T>(v[k] * a + b);
        }
    }
    CGRT_EPILOGUE
}

extern "C" __global__ void cgrt_fill_f32(unsigned long long* state, float* out, long long n,
                                         int kind, float a, float b, int advance) {
    cgrt_fill32<float>(state, out, n, kind, a, b, advance);
}
extern "C" __global__ void cgrt_fill_f16(unsigned long long* state, cgrt_half* out,
                                         long long n, int kind, float a, float b, int advance) {
    cgrt_fill32<cgrt_half>(state, out, n, kind, a, b, advance);
}

extern "C" __global__ void cgrt_fill_f64(unsigned long long* state, double* out, long long n,
                                         int kind, double a, double b, int advance) {
    const long long counters = (n + 1) / 2;
    CGRT_PROLOGUE
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < counters;
         j += stride) {
        cgrt_u4 r = cgrt_philox(base + (unsigned long long)j, seed);
        double v0, v1;
        if (kind == 0) {
            v0 = cgrt_u01d(r.x, r.y); v1 = cgrt_u01d(r.z, r.w);
        } else {
            double rad = sqrt(-2.0 * log(cgrt_u01d_open0(r.x, r.y)));
            double s, c;
            sincospi(2.0 * cgrt_u01d(r.z, r.w), &s, &c);
            v0 = rad * c; v1 = rad * s;
        }
        long long i0 = j * 2;
        if (i0 < n) out[i0] = v0 * a + b;
        if (i0 + 1 < n) out[i0 + 1] = v1 * a + b;
    }
    CGRT_EPILOGUE
}

// Integers in [low, low + range): Lemire's multiply-shift, no rejection (bias < range/2^32,
// or < range/2^64 for ranges above 2^32).
template <typename T>
__device__ void cgrt_randint(unsigned long long* state, T* out, long long n, long long low,
                             unsigned long long range, int advance) {
    const bool wide = range > 4294967296ull;
    const int per = wide ? 2 : 4;
    const long long counters = (n + per - 1) / per;
    CGRT_PROLOGUE
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < counters;
         j += stride) {
        cgrt_u4 r = cgrt_philox(base + (unsigned long long)j, seed);
        long long i0 = j * per;
        if (wide) {
            unsigned long long x0 = ((unsigned long long)r.x << 32) | r.y;
            unsigned long long x1 = ((unsigned long long)r.z << 32) | r.w;
            if (i0 < n) out[i0] = (T)(low + (long long)__umul64hi(x0, range));
            if (i0 + 1 < n) out[i0 + 1] = (T)(low + (long long)__umul64hi(x1, range));
        } else {
            unsigned int w[4] = {r.x, r.y, r.z, r.w};
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                if (i0 + k < n)
                    out[i0 + k] = (T)(low + (long long)(((unsigned long long)w[k] * range) >> 32));
            }
        }
    }
    CGRT_EPILOGUE
}

extern "C" __global__ void cgrt_randint_i64(unsigned long long* state, long long* out,
                                            long long n, long long low,
                                            unsigned long long range, int advance) {
    cgrt_randint<long long>(state, out, n, low, range, advance);
}
// One Philox stream per row (batched sampling): row r has its own seed, seeds[r], and its
// own position, state[r]; element (r, i) is word i % 4 of counter state[r] + i / 4, so what
// a row draws depends on its seed and position only, never on the other rows. kind 0:
// uniform in (0, 1) on the 2^-23 grid offset by half a step (never 0 or 1, so that the log
// below stays finite); kind 1: Gumbel noise -log(-log(u)). The last block to finish advances
// every row by the counters it used (state[rows] is the last-block counter).
extern "C" __global__ void cgrt_rows_f32(const unsigned long long* seeds,
                                         unsigned long long* state, float* out,
                                         long long rows, long long n, int kind, int advance) {
    const long long counters = (n + 3) / 4;
    const long long total = rows * counters;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += stride) {
        const long long r = t / counters, j = t - r * counters;
        cgrt_u4 w = cgrt_philox(state[r] + (unsigned long long)j, seeds[r]);
        unsigned int words[4] = {w.x, w.y, w.z, w.w};
        const long long i0 = j * 4;
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (i0 + k < n) {
                float u = ((float)(words[k] >> 9) + 0.5f) * 1.1920928955078125e-07f;
                out[r * n + i0 + k] = kind == 0 ? u : -logf(-logf(u));
            }
        }
    }
    __syncthreads();
    if (advance && threadIdx.x == 0) {
        __threadfence();
        unsigned int done = atomicAdd((unsigned int*)&state[rows], 1u);
        if (done == gridDim.x - 1) {
            for (long long r = 0; r < rows; ++r) state[r] += (unsigned long long)counters;
            state[rows] = 0ull;
            __threadfence();
        }
    }
}

extern "C" __global__ void cgrt_randint_i32(unsigned long long* state, int* out, long long n,
                                            long long low, unsigned long long range,
                                            int advance) {
    cgrt_randint<int>(state, out, n, low, range, advance);
}
"""

KERNEL_NAMES = ("cgrt_fill_f32", "cgrt_fill_f16", "cgrt_fill_f64", "cgrt_randint_i64",
                "cgrt_randint_i32", "cgrt_rows_f32")


# -- NumPy reference ------------------------------------------------------------------------


def philox4x32_10(counters: np.ndarray, key0: np.ndarray | int, key1: np.ndarray | int
                  ) -> np.ndarray:
    """Philox4x32-10 of an array of (c0, c1, c2, c3) counters; returns (n, 4) uint32 words."""
    c = np.array(counters, dtype=np.uint64).reshape(-1, 4) & MASK32
    c0, c1, c2, c3 = (c[:, i].copy() for i in range(4))
    k0 = np.full_like(c0, key0)
    k1 = np.full_like(c0, key1)
    for _ in range(10):
        p0 = np.uint64(PHILOX_M0) * c0
        p1 = np.uint64(PHILOX_M1) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(MASK32)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(MASK32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(PHILOX_W0)) & np.uint64(MASK32)
        k1 = (k1 + np.uint64(PHILOX_W1)) & np.uint64(MASK32)
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def reference_words(seed: int, position: int, counters: int) -> np.ndarray:
    """The (counters, 4) uint32 words a draw at ``position`` uses."""
    index = np.arange(counters, dtype=np.uint64) + np.uint64(position)
    ctr = np.zeros((counters, 4), dtype=np.uint64)
    ctr[:, 0] = index & np.uint64(MASK32)
    ctr[:, 1] = index >> np.uint64(32)
    return philox4x32_10(ctr, seed & MASK32, seed >> 32)


def reference_uniform(seed: int, position: int, n: int, dtype) -> np.ndarray:
    """Uniform [0, 1) draws exactly as the kernels make them (before scaling)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        words = reference_words(seed, position, (n + 1) // 2).astype(np.uint64)
        a = words[:, 0::2] >> np.uint64(5)
        b = words[:, 1::2] >> np.uint64(6)
        value = (a.astype(np.float64) * 67108864.0 + b.astype(np.float64)) * 2.0**-53
        return value.reshape(-1)[:n]
    words = reference_words(seed, position, (n + 3) // 4).reshape(-1)[:n]
    if dtype == np.float16:  # the 2^-11 grid: exact in float16, never rounds up to 1
        return ((words >> np.uint32(21)).astype(np.float32) * np.float32(2.0**-11)).astype(dtype)
    value = (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    return value.astype(dtype)


def reference_randint(seed: int, position: int, n: int, low: int, high: int) -> np.ndarray:
    """Integers in [low, high) exactly as the kernels make them (int64)."""
    span = high - low
    if span > 2**32:
        words = reference_words(seed, position, (n + 1) // 2).astype(object)
        x = (words[:, 0::2] << 32 | words[:, 1::2]).reshape(-1)[:n]
        return np.array([low + ((int(v) * span) >> 64) for v in x], dtype=np.int64)
    words = reference_words(seed, position, (n + 3) // 4).reshape(-1)[:n].astype(np.uint64)
    return (np.int64(low) + ((words * np.uint64(span)) >> np.uint64(32)).astype(np.int64))


def reference_rows(seeds, positions, n: int, kind: str = "uniform") -> np.ndarray:
    """What ``cgrt_rows_f32`` draws: a (rows, n) float32 array, row ``r`` from seed
    ``seeds[r]`` at position ``positions[r]``. ``kind`` ``"uniform"`` (in (0, 1), equal to the
    kernel's bit for bit) or ``"gumbel"`` (``-log(-log(u))`` in float32, within an ulp of the
    kernel's: CUDA's ``logf`` and NumPy's may round differently)."""
    rows = []
    for seed, position in zip(seeds, positions, strict=True):
        words = reference_words(int(seed), int(position), (n + 3) // 4).reshape(-1)[:n]
        u = ((words >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) \
            * np.float32(2.0**-23)
        rows.append(u if kind == "uniform" else -np.log(-np.log(u)))
    return np.stack(rows).astype(np.float32) if rows else np.zeros((0, n), np.float32)


def counters_for(kernel_family: str, n: int, wide: bool = False) -> int:
    """Counters a draw of ``n`` outputs consumes."""
    per = 2 if kernel_family == "u64" or wide else 4
    return (n + per - 1) // per
