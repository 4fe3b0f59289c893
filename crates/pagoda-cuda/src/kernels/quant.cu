// Quantized weight matrices in their stored block layouts (launched by quant.rs, which checks
// every size, alignment and buffer first).
//
// A matrix is `n` rows of `row_bytes` bytes each, row r at `w + r * row_bytes`, each row
// exactly the bytes the CPU keeps (GGUF blocks, or Pagoda's INT8 / INT4 / NF4 rows): see the
// layouts in pagoda-kernels' quant/ files, which are the reference these dequantize as.
// Every format is read in groups of 8 consecutive elements of a row (`dequant8<F>`: group g
// holds elements 8g..8g+8); a group never straddles a block, and within a block its 8
// codes are 8 consecutive bytes (the nibble formats keep elements j and j + 16 of a
// 32-element chunk in one byte, so the group's 8 bytes are shared with the group 16
// elements away, low or high nibble). Every block and every group's 8 code bytes start at
// an even byte offset for every format but NF4_DQ (its row header has one byte per block)
// and MXFP4 (17-byte blocks), so those are read as 16-bit words; NF4_DQ and MXFP4 read bytes.
//
// Kernels, one set per format (suffix = QuantFormat::name on the host):
// - qgemv_<f>:    out[r, i] = sum_c W[i, c] * x[r, c] for r < m (m <= 8 activation rows, f32):
//                 one warp per weight row, GEMV_WARPS rows per block; each lane dequantizes
//                 groups lane, lane + 32, ... in registers and multiplies them with every
//                 activation row (two float4 loads per row and group: x must be 16-byte
//                 aligned, rows of k floats, k a multiple of 32); f32 sums, warp shuffle.
// - qdequant_<f>: rows r0 .. r0 + nrows of W as bf16 (round to nearest even) into a
//                 [nrows, k] tile (one uint4 store per group: 16-byte aligned), for the
//                 cuBLAS GEMM of prefill; grid-stride.
// - qembed_<f>:   out[r] = W[tokens[r]] * scale (f32), one block per token; a token outside
//                 the vocabulary gives a NaN row (as embed_bf16).
// And for the 8-bit formats (Q8_0, INT8), the GEMV on int8 dot products (dp4a): the
// activations quantized per 32 values by quantize_q8_act, then qgemv8_<f> as qgemv_<f> with
// two dp4a per group of 8 (see gemv8_body).
// No fast-math intrinsics; f16 scales are converted with cvt.f32.f16 (no headers needed).
// The two inline-PTX statements (cvt.f32.f16, dp4a) have a host path for the CUDA
// interpreter (PAGODA_CUDA_HOST, set by interpret/cuda_host.h).
// The layout code (dequant8 and what it calls) is also compiled as host C++ by a test
// (PAGODA_HOST_TEST), so it is executed against pagoda-kernels on machines without a GPU.

typedef unsigned short bf16_t;
typedef unsigned char u8;

#define GEMV_WARPS 4
#define GEMV_THREADS (GEMV_WARPS * 32)
#define MAX_ROWS 8

// Format ids (the order of QuantFormat::ALL on the host).
#define F_Q8_0 0
#define F_Q4_0 1
#define F_Q4_1 2
#define F_Q4_K 3
#define F_Q5_K 4
#define F_Q6_K 5
#define F_INT8 6
#define F_I4_G64 7
#define F_I4_G64_SYM 8
#define F_I4_G128 9
#define F_I4_G128_SYM 10
#define F_NF4 11
#define F_NF4_DQ 12
#define F_MXFP4 13

// bitsandbytes' NF4 codebook (pagoda-kernels' NF4_CODEBOOK, the same f32 values).
__constant__ float NF4_CODEBOOK[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236572f, 1.0f};

// MXFP4's E2M1 values doubled (pagoda-kernels' mxfp4::KVALUES; ggml's kvalues_mxfp4).
__constant__ float MXFP4_KVALUES[16] = {0.0f,  1.0f,  2.0f,  3.0f,  4.0f,  6.0f,  8.0f,  12.0f,
                                        0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

// Half the E8M0 exponent's value, 2^(e - 128), bit for bit as ggml's GGML_E8M0_TO_FP32_HALF.
__device__ __forceinline__ float e8m0_half(unsigned int e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

#if defined(PAGODA_CUDA_HOST)
// The CUDA interpreter's path (interpret/cuda_host.h): the same exact conversion.
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    const unsigned s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0    ? ldexpf((float)m, -24)
                    : e == 31 ? (m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000))
                              : ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
#elif !defined(PAGODA_HOST_TEST)
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#endif

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

// Round to nearest even, NaN kept quiet (as half::bf16::from_f32; elementwise.cu's).
__device__ __forceinline__ unsigned int f32_to_bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

// Loads from an even address.
__device__ __forceinline__ unsigned int ld_u16(const u8* p) {
    return (unsigned int)*reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32((unsigned short)ld_u16(p)); }
__device__ __forceinline__ float ld_f32_even(const u8* p) {
    return __uint_as_float(ld_u16(p) | (ld_u16(p + 2) << 16));
}
// Eight bytes from an even address, byte i in b[i].
__device__ __forceinline__ void ld8_even(const u8* p, unsigned int* b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int h = ld_u16(p + 2 * i);
        b[2 * i] = h & 0xffu;
        b[2 * i + 1] = h >> 8;
    }
}
// From any address.
__device__ __forceinline__ float ld_f32_any(const u8* p) {
    return __uint_as_float((unsigned int)p[0] | ((unsigned int)p[1] << 8) |
                           ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24));
}

// The 6-bit scale and minimum of sub-block s of a Q4_K / Q5_K block's 12 packed bytes.
__device__ __forceinline__ void k_scale_min(const u8* q, int s, float* sc, float* mn) {
    if (s < 4) {
        *sc = (float)(q[s] & 63);
        *mn = (float)(q[s + 4] & 63);
    } else {
        *sc = (float)((q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4));
        *mn = (float)((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
    }
}

// Elements 8g .. 8g + 8 of a row of k elements, in v.
template <int F>
__device__ __forceinline__ void dequant8(const u8* row, int g, int k, float* v) {
    unsigned int b[8];
    if constexpr (F == F_Q8_0) {
        // [d: f16][qs: i8 x 32], 34 bytes per 32.
        const u8* blk = row + (long long)(g >> 2) * 34;
        const float d = ld_f16(blk);
        ld8_even(blk + 2 + 8 * (g & 3), b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (float)(signed char)b[i] * d;
    } else if constexpr (F == F_Q4_0 || F == F_Q4_1) {
        // [d: f16]([m: f16])[qs: 16], byte j = element j (low) and j + 16 (high).
        constexpr int BS = F == F_Q4_0 ? 18 : 20;
        const u8* blk = row + (long long)(g >> 2) * BS;
        const int w = g & 3, shift = (w >> 1) * 4;
        const float d = ld_f16(blk);
        ld8_even(blk + (BS - 16) + 8 * (w & 1), b);
        if constexpr (F == F_Q4_0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = d * (float)((int)((b[i] >> shift) & 0xF) - 8);
        } else {
            const float m = ld_f16(blk + 2);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = d * (float)((b[i] >> shift) & 0xF) + m;
        }
    } else if constexpr (F == F_Q4_K || F == F_Q5_K) {
        // [d][dmin][scales: 12]([qh: 32])[qs: 128]; sub-block s = 2c + h of 32 elements,
        // q = (qs[32c + l] >> 4h) & 0xF (| ((qh[l] >> s) & 1) << 4 for Q5_K).
        constexpr int BS = F == F_Q4_K ? 144 : 176;
        const u8* blk = row + (long long)(g >> 5) * BS;
        const int w = g & 31, s = w >> 2, l0 = (w & 3) * 8, c = s >> 1, h = s & 1;
        float sc, mn;
        k_scale_min(blk + 4, s, &sc, &mn);
        const float ds = ld_f16(blk) * sc, ms = ld_f16(blk + 2) * mn;
        ld8_even(blk + (F == F_Q4_K ? 16 : 48) + 32 * c + l0, b);
        if constexpr (F == F_Q4_K) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = ds * (float)((b[i] >> (4 * h)) & 0xF) - ms;
        } else {
            unsigned int hb[8];
            ld8_even(blk + 16 + l0, hb);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const unsigned int q = ((b[i] >> (4 * h)) & 0xF) | (((hb[i] >> s) & 1u) << 4);
                v[i] = ds * (float)q - ms;
            }
        }
    } else if constexpr (F == F_Q6_K) {
        // [ql: 128][qh: 64][scales: i8 x 16][d: f16], 210 bytes; element e = 128h + 32k + l:
        // q = ((ql[64h + l + 32(k & 1)] >> 4(k >> 1)) & 0xF) | ((qh[32h + l] >> 2k) & 3) << 4,
        // x = d * scales[e / 16] * (q - 32).
        const u8* blk = row + (long long)(g >> 5) * 210;
        const int e = (g & 31) * 8, h = e >> 7, kk = (e & 127) >> 5, l0 = e & 31;
        unsigned int hb[8];
        ld8_even(blk + 64 * h + l0 + 32 * (kk & 1), b);
        ld8_even(blk + 128 + 32 * h + l0, hb);
        const float dg = ld_f16(blk + 208) * (float)(signed char)blk[192 + (e >> 4)];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = (int)(((b[i] >> (4 * (kk >> 1))) & 0xF) | (((hb[i] >> (2 * kk)) & 3u) << 4));
            v[i] = dg * (float)(q - 32);
        }
    } else if constexpr (F == F_INT8) {
        // [s: f32][q: i8 x k].
        const float s = ld_f32_even(row);
        ld8_even(row + 4 + 8 * (long long)g, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (float)(signed char)b[i] * s;
    } else if constexpr (F >= F_I4_G64 && F <= F_I4_G128_SYM) {
        // Groups of G: [d: f16]([m: f16])[codes: G/2], per 32: byte j = j (low), j + 16 (high).
        constexpr int G = (F == F_I4_G64 || F == F_I4_G64_SYM) ? 64 : 128;
        constexpr bool SYM = F == F_I4_G64_SYM || F == F_I4_G128_SYM;
        constexpr int HDR = SYM ? 2 : 4;
        constexpr int GB = G / 2 + HDR;
        const int e = 8 * g, o = e % G, j = o & 31, shift = (j >> 4) * 4;
        const u8* blk = row + (long long)(e / G) * GB;
        const float d = ld_f16(blk);
        ld8_even(blk + HDR + 16 * (o >> 5) + (j & 15), b);
        if constexpr (SYM) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = d * ((float)((b[i] >> shift) & 0xF) - 8.0f);
        } else {
            const float m = ld_f16(blk + 2);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = d * (float)((b[i] >> shift) & 0xF) + m;
        }
    } else if constexpr (F == F_NF4) {
        // [absmax: f32][codes: 32], 36 bytes per 64.
        const int e = 8 * g, o = e & 63, j = o & 31, shift = (j >> 4) * 4;
        const u8* blk = row + (long long)(e >> 6) * 36;
        const float amax = ld_f32_even(blk);
        ld8_even(blk + 4 + 16 * (o >> 5) + (j & 15), b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = NF4_CODEBOOK[(b[i] >> shift) & 0xF] * amax;
    } else if constexpr (F == F_NF4_DQ) {
        // [mean: f32][c: f32 per 256 blocks][kb: i8 per block][codes: 32 per block];
        // absmax = kb * c + mean, rounded after each operation as the CPU does.
        const int nb = k >> 6, groups = (nb + 255) >> 8;
        const int k_off = 4 + 4 * groups, q_off = k_off + nb;
        const int e = 8 * g, blk = e >> 6, o = e & 63, j = o & 31, shift = (j >> 4) * 4;
        const float c = ld_f32_any(row + 4 + 4 * (blk >> 8));
        const float amax =
            __fadd_rn(__fmul_rn((float)(signed char)row[k_off + blk], c), ld_f32_any(row));
        const u8* q = row + q_off + 32 * (long long)blk + 16 * (o >> 5) + (j & 15);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = NF4_CODEBOOK[(q[i] >> shift) & 0xF] * amax;
    } else if constexpr (F == F_MXFP4) {
        // [e: E8M0][qs: 16], 17 bytes per 32; byte j = element j (low) and j + 16 (high).
        const u8* blk = row + (long long)(g >> 2) * 17;
        const int w = g & 3, shift = (w >> 1) * 4;
        const float d = e8m0_half(blk[0]);
        const u8* q = blk + 1 + 8 * (w & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = MXFP4_KVALUES[(q[i] >> shift) & 0xF] * d;
    }
}

// Everything below runs on the GPU only; everything above also compiles as host C++ (with
// PAGODA_HOST_TEST and the shims of tests/quantized.rs), which runs dequant8 on the CPU.
#ifndef PAGODA_HOST_TEST

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <int F>
__device__ __forceinline__ void gemv_body(const u8* w, long long row_bytes, const float* x,
                                          float* out, int n, int k, int m) {
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (i >= n) return;  // the whole warp: no shuffle below is left half-joined
    const u8* row = w + (long long)i * row_bytes;
    float acc[MAX_ROWS];
#pragma unroll
    for (int r = 0; r < MAX_ROWS; ++r) acc[r] = 0.0f;
    const int groups = k >> 3;
    for (int g = lane; g < groups; g += 32) {
        float v[8];
        dequant8<F>(row, g, k, v);
#pragma unroll
        for (int r = 0; r < MAX_ROWS; ++r) {
            if (r < m) {
                const float4* xp = reinterpret_cast<const float4*>(x + (long long)r * k + 8 * g);
                const float4 a = xp[0], c = xp[1];
                float s = acc[r];
                s = fmaf(v[0], a.x, s);
                s = fmaf(v[1], a.y, s);
                s = fmaf(v[2], a.z, s);
                s = fmaf(v[3], a.w, s);
                s = fmaf(v[4], c.x, s);
                s = fmaf(v[5], c.y, s);
                s = fmaf(v[6], c.z, s);
                s = fmaf(v[7], c.w, s);
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MAX_ROWS; ++r) {
        if (r < m) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) out[(long long)r * n + i] = s;
        }
    }
}

template <int F>
__device__ __forceinline__ void dequant_body(const u8* w, long long row_bytes, bf16_t* out, int r0,
                                             int nrows, int k) {
    const int groups = k >> 3;
    const long long total = (long long)nrows * groups;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x) {
        const long long r = t / groups;
        const int g = (int)(t - r * groups);
        float v[8];
        dequant8<F>(w + (r0 + r) * row_bytes, g, k, v);
        uint4 o;
        o.x = f32_to_bf16_bits(v[0]) | (f32_to_bf16_bits(v[1]) << 16);
        o.y = f32_to_bf16_bits(v[2]) | (f32_to_bf16_bits(v[3]) << 16);
        o.z = f32_to_bf16_bits(v[4]) | (f32_to_bf16_bits(v[5]) << 16);
        o.w = f32_to_bf16_bits(v[6]) | (f32_to_bf16_bits(v[7]) << 16);
        *reinterpret_cast<uint4*>(out + r * k + 8 * g) = o;
    }
}

template <int F>
__device__ __forceinline__ void embed_body(const u8* w, long long row_bytes,
                                           const unsigned int* tokens, float* out, int rows, int k,
                                           int vocab, float scale) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const unsigned int tok = tokens[r];
    float* o = out + (long long)r * k;
    if (tok >= (unsigned int)vocab) {
        for (int c = threadIdx.x; c < k; c += blockDim.x) o[c] = nan_f32();
        return;
    }
    const u8* row = w + (long long)tok * row_bytes;
    for (int g = threadIdx.x; g < (k >> 3); g += blockDim.x) {
        float v[8];
        dequant8<F>(row, g, k, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[8 * g + i] = v[i] * scale;
    }
}

// ------------------------------------------------------- 8-bit weights: int8 dot products

// Activations for the dp4a GEMV: xq = round(x / s) (half away from zero, |xq| <= 127) with
// one scale s = amax / 127 per 32 consecutive values (xs; the rows' length k is a multiple of
// 32, so a block never straddles two rows). One warp per block, grid-stride over blocks.
extern "C" __global__ void quantize_q8_act(const float* x, signed char* xq, float* xs,
                                           long long nblocks) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)blockDim.x * gridDim.x) >> 5;
    for (long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < nblocks;
         b += warps) {
        const float v = x[b * 32 + lane];
        float amax = fabsf(v);
        for (int off = 16; off > 0; off >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const float q = fminf(fmaxf(roundf(v * id), -127.0f), 127.0f);
        xq[b * 32 + lane] = (signed char)(int)q;
        if (lane == 0) xs[b] = d;
    }
}

__device__ __forceinline__ int dp4a(int a, int b, int c) {
#if defined(PAGODA_CUDA_HOST)
    // The CUDA interpreter's path: four signed byte products added to c, as dp4a.s32.s32.
    for (int j = 0; j < 4; ++j) {
        c += (int)(signed char)((unsigned)a >> (8 * j)) * (int)(signed char)((unsigned)b >> (8 * j));
    }
    return c;
#else
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// Four bytes from an even address as one little-endian word (byte j = element j).
__device__ __forceinline__ int ld4_even(const u8* p) {
    return (int)(ld_u16(p) | (ld_u16(p + 2) << 16));
}

// As gemv_body, for Q8_0 and INT8 weights against quantize_q8_act's activations: per group
// of 8, two dp4a give the integer sum, scaled by the weight block's d (Q8_0; INT8's row
// scale multiplies the row's sum at the end) and the activation block's scale.
template <int F>
__device__ __forceinline__ void gemv8_body(const u8* w, long long row_bytes, const signed char* xq,
                                           const float* xs, float* out, int n, int k, int m) {
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (i >= n) return;
    const u8* row = w + (long long)i * row_bytes;
    float acc[MAX_ROWS];
#pragma unroll
    for (int r = 0; r < MAX_ROWS; ++r) acc[r] = 0.0f;
    const int groups = k >> 3, nb = k >> 5;
    for (int g = lane; g < groups; g += 32) {
        const u8* codes;
        float d;
        if constexpr (F == F_Q8_0) {
            const u8* blk = row + (long long)(g >> 2) * 34;
            d = ld_f16(blk);
            codes = blk + 2 + 8 * (g & 3);
        } else {
            d = 1.0f;
            codes = row + 4 + 8 * (long long)g;
        }
        const int w0 = ld4_even(codes), w1 = ld4_even(codes + 4);
#pragma unroll
        for (int r = 0; r < MAX_ROWS; ++r) {
            if (r < m) {
                const int2 a = *reinterpret_cast<const int2*>(xq + (long long)r * k + 8 * g);
                const int s = dp4a(w1, a.y, dp4a(w0, a.x, 0));
                acc[r] = fmaf((float)s, d * xs[(long long)r * nb + (g >> 2)], acc[r]);
            }
        }
    }
    const float row_scale = F == F_INT8 ? ld_f32_even(row) : 1.0f;
#pragma unroll
    for (int r = 0; r < MAX_ROWS; ++r) {
        if (r < m) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) out[(long long)r * n + i] = s * row_scale;
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    qgemv8_q8_0(const u8* w, long long row_bytes, const signed char* xq, const float* xs,
                float* out, int n, int k, int m) {
    gemv8_body<F_Q8_0>(w, row_bytes, xq, xs, out, n, k, m);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
    qgemv8_int8(const u8* w, long long row_bytes, const signed char* xq, const float* xs,
                float* out, int n, int k, int m) {
    gemv8_body<F_INT8>(w, row_bytes, xq, xs, out, n, k, m);
}

// ------------------------------------------------------------------- entry points per format

#define QUANT_KERNELS(name, F)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                  \
        qgemv_##name(const u8* w, long long row_bytes, const float* x, float* out, int n, int k, \
                     int m) {                                                                   \
        gemv_body<F>(w, row_bytes, x, out, n, k, m);                                            \
    }                                                                                           \
    extern "C" __global__ void qdequant_##name(const u8* w, long long row_bytes, bf16_t* out,   \
                                               int r0, int nrows, int k) {                      \
        dequant_body<F>(w, row_bytes, out, r0, nrows, k);                                       \
    }                                                                                           \
    extern "C" __global__ void qembed_##name(const u8* w, long long row_bytes,                  \
                                             const unsigned int* tokens, float* out, int rows,  \
                                             int k, int vocab, float scale) {                   \
        embed_body<F>(w, row_bytes, tokens, out, rows, k, vocab, scale);                        \
    }

QUANT_KERNELS(q8_0, F_Q8_0)
QUANT_KERNELS(q4_0, F_Q4_0)
QUANT_KERNELS(q4_1, F_Q4_1)
QUANT_KERNELS(q4_k, F_Q4_K)
QUANT_KERNELS(q5_k, F_Q5_K)
QUANT_KERNELS(q6_k, F_Q6_K)
QUANT_KERNELS(int8, F_INT8)
QUANT_KERNELS(int4_g64, F_I4_G64)
QUANT_KERNELS(int4_g64_sym, F_I4_G64_SYM)
QUANT_KERNELS(int4_g128, F_I4_G128)
QUANT_KERNELS(int4_g128_sym, F_I4_G128_SYM)
QUANT_KERNELS(nf4, F_NF4)
QUANT_KERNELS(nf4_dq, F_NF4_DQ)
QUANT_KERNELS(mxfp4, F_MXFP4)

#endif  // PAGODA_HOST_TEST
