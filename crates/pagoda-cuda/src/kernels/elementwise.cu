// Pagoda's row and elementwise kernels (launched by ops.rs, which checks every size first).
//
// Conventions: activations are f32; bf16 values travel as their 16 bits (no cuda_bf16.h, so
// NVRTC needs no headers); every element offset that can exceed 2^31 is computed in 64 bits;
// 1-D kernels use grid-stride loops, so any grid size is correct; row kernels take one block
// per row (gridDim.x = rows) and a block size that is a multiple of 32. No kernel here uses
// fast-math intrinsics: expf/tanhf/sincosf/sqrtf are the accurate ones, as on the CPU.

typedef unsigned short bf16_t;

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// Round to nearest even, NaN kept quiet (as half::bf16::from_f32).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

#define GRID_STRIDE(i, n)                                                             \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); \
         i += (long long)blockDim.x * gridDim.x)

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 and at
// most 1024; every thread of the block must call it (it synchronises).
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] */) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    __syncthreads();
    return total;
}

// out[r, :] = table[tokens[r], :] * scale; a token outside the vocabulary gives a NaN row.
extern "C" __global__ void embed_bf16(const bf16_t* table, const unsigned int* tokens, float* out,
                                      int rows, int d, int vocab, float scale) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const unsigned int tok = tokens[r];
    float* o = out + (long long)r * d;
    if (tok >= (unsigned int)vocab) {
        for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = nan_f32();
        return;
    }
    const bf16_t* t = table + (long long)tok * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = bf16_to_f32(t[c]) * scale;
}

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * (weight + offset); out may equal x (in place:
// each thread reads the elements it writes, after the reduction).
extern "C" __global__ void rms_norm(const float* x, const float* weight, float* out, int rows,
                                    int dim, float eps, float offset) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;  // uniform over the block
    const float* xr = x + (long long)r * dim;
    float* orow = out + (long long)r * dim;
    float s = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float v = xr[c];
        s += v * v;
    }
    s = block_sum(s, scratch);
    const float scale = 1.0f / sqrtf(s / (float)dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        orow[c] = xr[c] * scale * (weight[c] + offset);
    }
}

// x += y
extern "C" __global__ void add_f32(float* x, const float* y, long long n) {
    GRID_STRIDE(i, n) { x[i] += y[i]; }
}

// out[r, c] += bias[c]
extern "C" __global__ void add_bias(float* out, const float* bias, long long rows, int cols) {
    GRID_STRIDE(i, rows * cols) { out[i] += bias[i % cols]; }
}

// gate = silu(gate) * up
extern "C" __global__ void silu_mul(float* gate, const float* up, long long n) {
    GRID_STRIDE(i, n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// gate = gelu_tanh(gate) * up
extern "C" __global__ void gelu_tanh_mul(float* gate, const float* up, long long n) {
    const float SQRT_2_OVER_PI = 0.7978846f;
    GRID_STRIDE(i, n) {
        const float x = gate[i];
        const float t = tanhf(SQRT_2_OVER_PI * (x + 0.044715f * x * x * x));
        gate[i] = 0.5f * x * (1.0f + t) * up[i];
    }
}

// gate = g * sigmoid(1.702 g) * (u + 1), g = min(gate, 7), u = clamp(up, -7, 7) (gpt-oss)
extern "C" __global__ void swiglu_oai_mul(float* gate, const float* up, long long n) {
    GRID_STRIDE(i, n) {
        const float g = fminf(gate[i], 7.0f);
        const float u = fminf(fmaxf(up[i], -7.0f), 7.0f);
        gate[i] = g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
    }
}

// out = bf16(x), round to nearest even
extern "C" __global__ void to_bf16(const float* x, bf16_t* out, long long n) {
    GRID_STRIDE(i, n) { out[i] = f32_to_bf16(x[i]); }
}

// x *= s
extern "C" __global__ void scale_f32(float* x, long long n, float s) {
    GRID_STRIDE(i, n) { x[i] *= s; }
}

// out[r, c] = x[r, col0 + c] for x of rows `width` wide, out of rows `cols` wide.
extern "C" __global__ void copy_columns(const float* x, float* out, long long rows, int width,
                                       int col0, int cols) {
    GRID_STRIDE(i, rows * cols) {
        const long long r = i / cols;
        const int c = (int)(i % cols);
        out[i] = x[r * width + col0 + c];
    }
}

// x[rows[j], :] += weights[j] * y[j, :] (rows distinct: no two threads write one value)
extern "C" __global__ void scatter_add_rows(float* x, const float* y, const int* rows,
                                           const float* weights, int n, int d) {
    GRID_STRIDE(i, (long long)n * d) {
        const int j = (int)(i / d);
        const int c = (int)(i % d);
        x[(long long)rows[j] * d + c] += weights[j] * y[i];
    }
}

// x = cap * tanh(x / cap)
extern "C" __global__ void softcap(float* x, long long n, float cap) {
    GRID_STRIDE(i, n) { x[i] = cap * tanhf(x[i] / cap); }
}

// out[i, :] = x[rows[i], :]; an index outside 0..total gives a NaN row.
extern "C" __global__ void gather_rows(const float* x, const int* rows, float* out, int n, int d,
                                       int total) {
    const int i = blockIdx.x;
    if (i >= n) return;
    const int src = rows[i];
    float* o = out + (long long)i * d;
    if (src < 0 || src >= total) {
        for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = nan_f32();
        return;
    }
    const float* s = x + (long long)src * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = s[c];
}

// Rotates the first 2*half values of each head of row r (x: [rows, heads * head_dim]) by
// angle positions[r] * inv_freq[i] (f32 product, as the CPU), cos/sin times mscale, and, when
// temp_floor > 0, times Llama 4's query temperature 1 + temp_beta * ln(1 + floor(pos /
// temp_floor)). neox != 0: pairs (i, i + half); else adjacent pairs (2i, 2i + 1).
extern "C" __global__ void rope(float* x, const int* positions, const float* inv_freq, int rows,
                                int heads, int head_dim, int half, int neox, float mscale,
                                float temp_beta, int temp_floor) {
    GRID_STRIDE(idx, (long long)rows * heads * half) {
        const int i = (int)(idx % half);
        const long long rh = idx / half;
        const int h = (int)(rh % heads);
        const long long r = rh / heads;
        const float angle = (float)positions[r] * inv_freq[i];
        float s, c;
        sincosf(angle, &s, &c);
        float scale = mscale;
        if (temp_floor > 0) scale *= 1.0f + temp_beta * logf(1.0f + (float)(positions[r] / temp_floor));
        c *= scale;
        s *= scale;
        float* head = x + (r * heads + h) * (long long)head_dim;
        const int ia = neox ? i : 2 * i;
        const int ib = neox ? i + half : 2 * i + 1;
        const float a = head[ia], b = head[ib];
        head[ia] = a * c - b * s;
        head[ib] = a * s + b * c;
    }
}

// k_cache[slots[r], :] = bf16(k[r, :]) and the same for v; a slot < 0 (or >= n_slots) is
// skipped.
extern "C" __global__ void kv_write(const float* k, const float* v, bf16_t* k_cache,
                                    bf16_t* v_cache, const int* slots, int rows, int kv_dim,
                                    int n_slots) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int slot = slots[r];
    if (slot < 0 || slot >= n_slots) return;
    const long long src = (long long)r * kv_dim;
    const long long dst = (long long)slot * kv_dim;
    for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
        k_cache[dst + c] = f32_to_bf16(k[src + c]);
        v_cache[dst + c] = f32_to_bf16(v[src + c]);
    }
}

// The FP8 E4M3 code nearest to x, ties to even, saturating to +-448 (inf included), NaN kept:
// pagoda_kernels::fp8::E4m3::from_f32 bit for bit. Written out rather than taken from
// cuda_fp8.h (NVRTC has no headers here) and the same on every architecture (sm_89+'s
// cvt.rn.satfinite.e4m3x2 gives the same codes; this runs on sm_80 too).
__device__ __forceinline__ unsigned char f32_to_e4m3(float x) {
    const unsigned int bits = __float_as_uint(x);
    const unsigned int sign = (bits >> 24) & 0x80u;
    const unsigned int ab = bits & 0x7fffffffu;
    if (ab > 0x7f800000u) return (unsigned char)(sign | 0x7fu);  // NaN
    const float a = __uint_as_float(ab);
    if (a >= 448.0f) return (unsigned char)(sign | 0x7eu);
    // Subnormal codes are the integers a * 2^9 (exact), rounded to even.
    if (a < 0.015625f) return (unsigned char)(sign | (unsigned int)rintf(a * 512.0f));
    // Keep 3 of the 23 mantissa bits, ties to even; a carry moves into the exponent.
    const unsigned int code = ((ab + 0x7ffffu + ((ab >> 20) & 1u)) >> 20) - (120u << 3);
    return (unsigned char)(sign | min(code, 0x7eu));
}

// As kv_write into FP8 E4M3 caches: code = e4m3(x / scale), one static scale for K and one
// for V (pagoda_kernels::kv_blocks' FP8 storage).
extern "C" __global__ void kv_write_fp8(const float* k, const float* v, unsigned char* k_cache,
                                        unsigned char* v_cache, const int* slots, int rows,
                                        int kv_dim, int n_slots, float k_scale, float v_scale) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int slot = slots[r];
    if (slot < 0 || slot >= n_slots) return;
    const long long src = (long long)r * kv_dim;
    const long long dst = (long long)slot * kv_dim;
    for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
        k_cache[dst + c] = f32_to_e4m3(k[src + c] / k_scale);
        v_cache[dst + c] = f32_to_e4m3(v[src + c] / v_scale);
    }
}
