// What CUDA C kernel code expects from the CUDA compiler, provided for a host C++ compiler,
// so that pagoda-cuda's kernels (src/kernels/*.cu) compile unchanged for the CUDA
// interpreter: qualifiers, built-in indices, barriers, warp shuffles, vector types, bit casts
// and the math functions the kernels call. Kernel sources test PAGODA_CUDA_HOST where they
// need a host path (inline PTX).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime.h"

#define PAGODA_CUDA_HOST 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// One block runs at a time (runtime.h), so a block's shared array can be a static one.
#define __shared__ static
#define __constant__ static const
#define __align__(n) __attribute__((aligned(n)))

#define threadIdx (::pagoda_interp::current().thread_idx)
#define blockIdx (::pagoda_interp::current().block_idx)
#define blockDim (::pagoda_interp::current().block_dim)
#define gridDim (::pagoda_interp::current().grid_dim)
#define warpSize 32

inline void __syncthreads() { ::pagoda_interp::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::pagoda_interp::syncwarp(mask); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lanemask, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a word");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = ::pagoda_interp::shfl_xor_bits(mask, bits, lanemask, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int __float_as_int(float f) {
    int u;
    std::memcpy(&u, &f, 4);
    return u;
}
// Rounded, never fused with a neighbouring operation (as on the GPU).
inline float __fadd_rn(float a, float b) {
    volatile float r = a + b;
    return r;
}
inline float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}

// CUDA's integer min/max overloads.
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
