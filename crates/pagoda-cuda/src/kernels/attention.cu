// Paged attention over a bf16 or FP8 E4M3 K/V cache (launched by attention.rs, which checks
// every size, the block tables and the cache's alignment first).
//
// Layout: q and out are f32 [rows, n_heads * head_dim]; k_cache / v_cache are bf16 or E4M3
// codes [n_slots, n_kv_heads * head_dim], position t of a sequence at slot
// table[t / block_size] * block_size + t % block_size. Query row r of a sequence sits at
// position start + (r - first_row) and sees positions first_visible(pos) ..= pos
// (first_visible = max(0, pos + 1 - window), 0 without a window); head h reads kv head
// h / (n_heads / n_kv_heads); score = (q . k) * scale, then cap * tanh(score / cap) when
// cap > 0; softmax in f32; out f32.
//
// Sequence metadata (int arrays): seq_first_row, seq_rows, seq_start, seq_table_off (offset
// of the sequence's block table in `tables`). head_dim is a multiple of 8 (16, 64, 80, 96,
// 128, 256 in the models Pagoda runs), at most 256, so a K/V row of a head is head_dim / 8
// 16-byte chunks (<= 32), 16-byte aligned (the host checks the cache pointers' alignment).
//
// Element types: each kernel body is a template over the cache's element (KvBf16, KvFp8), with
// one entry point per type (`attn_decode` / `attn_decode_fp8`, ...). An FP8 code is widened
// in registers by hand (no cuda_fp8.h under NVRTC; the same on sm_80 as on sm_89+) to its
// exact value; the caches' static scales are applied outside the inner loops: the keys'
// folded by the host into `scale`, the values' (`v_scale`) on the output (1 for bf16, so
// the bf16 kernels compute exactly what they did before FP8 existed). FP8 rows are read 8
// bytes per lane (8-byte aligned); the prefill kernel widens FP8 tiles to bf16 in shared
// memory (exact: E4M3 values are bf16 values).
//
// Kernels:
// - attn_decode: one block per (decode sequence, query head, split) over a split of the
//   visible positions (flash-decoding). With one split it writes out directly; otherwise it
//   leaves (max, sum, unnormalised accumulator) in the workspace for attn_decode_reduce.
// - attn_decode_reduce: one block per (decode sequence, head): merges the splits.
// - attn_prefill: one block per (tile of PF_BQ query rows of one sequence, query head):
//   flash-attention tiles of PF_BK positions in shared memory, online softmax.
// All __syncthreads are in block-uniform control flow, every shuffle runs on all 32 lanes.

typedef unsigned short bf16_t;

#define MAX_HD 256
#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

__device__ __forceinline__ int first_visible(int window, int pos) {
    return window > 0 ? max(0, pos + 1 - window) : 0;
}

__device__ __forceinline__ float cap_score(float s, float softcap) {
    return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

__device__ __forceinline__ long long slot_of(const int* table, int block_size, int p) {
    return (long long)table[p / block_size] * block_size + p % block_size;
}

typedef unsigned char fp8_t;

// The exact value of an E4M3 code (pagoda_kernels::fp8::E4m3::to_f32): s eeee mmm, bias 7,
// subnormal m * 2^-9 below exponent 1, NaN for s 1111 111.
__device__ __forceinline__ float e4m3_to_f32(unsigned int b) {
    const unsigned int sign = (b & 0x80u) << 24;
    const unsigned int em = b & 0x7fu;
    if (em == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
    const float mag =
        em < 8u ? (float)em * 0.001953125f : __uint_as_float((em << 20) + (120u << 23));
    return __uint_as_float(__float_as_uint(mag) | sign);
}

// bf16 bits of an E4M3 code's value (exact: 3 mantissa bits, exponents within bf16's).
__device__ __forceinline__ unsigned int e4m3_to_bf16_bits(unsigned int b) {
    return __float_as_uint(e4m3_to_f32(b)) >> 16;
}

// Eight consecutive K/V values of a bf16 cache (16 bytes, 16-byte aligned).
struct KvBf16 {
    typedef bf16_t T;
    __device__ static __forceinline__ void load8(const T* p, float v[8]) {
        const uint4 w = *reinterpret_cast<const uint4*>(p);
        v[0] = bf16_lo(w.x);
        v[1] = bf16_hi(w.x);
        v[2] = bf16_lo(w.y);
        v[3] = bf16_hi(w.y);
        v[4] = bf16_lo(w.z);
        v[5] = bf16_hi(w.z);
        v[6] = bf16_lo(w.w);
        v[7] = bf16_hi(w.w);
    }
    // The same eight values as bf16 pairs.
    __device__ static __forceinline__ uint4 load8_bf16(const T* p) {
        return *reinterpret_cast<const uint4*>(p);
    }
};

// Eight consecutive K/V codes of an FP8 E4M3 cache (8 bytes, 8-byte aligned).
struct KvFp8 {
    typedef fp8_t T;
    __device__ static __forceinline__ void load8(const T* p, float v[8]) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[j] = e4m3_to_f32((w.x >> (8 * j)) & 0xffu);
            v[4 + j] = e4m3_to_f32((w.y >> (8 * j)) & 0xffu);
        }
    }
    __device__ static __forceinline__ unsigned int pair(unsigned int w, int j) {
        return e4m3_to_bf16_bits((w >> (16 * j)) & 0xffu) |
               (e4m3_to_bf16_bits((w >> (16 * j + 8)) & 0xffu) << 16);
    }
    __device__ static __forceinline__ uint4 load8_bf16(const T* p) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        return make_uint4(pair(w.x, 0), pair(w.x, 1), pair(w.y, 0), pair(w.y, 1));
    }
};

// ---------------------------------------------------------------------------------- decode

#define DEC_THREADS 128
#define DEC_WARPS 4
// Most positions one split covers (the host never asks for more).
#define DEC_SPLIT_MAX 512

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

template <class KV>
__device__ __forceinline__ void attn_decode_body(
    const float* q, const typename KV::T* k_cache, const typename KV::T* v_cache, float* out,
    float* ws_acc, float* ws_ml, const int* decode_seqs, const int* seq_first_row,
    const int* seq_start, const int* seq_table_off, const int* tables, int n_heads,
    int n_kv_heads, int head_dim, int block_size, float scale, float softcap, int window,
    int split_len, int n_splits, float v_scale, const float* sinks) {
    __shared__ __align__(16) float q_sh[MAX_HD];
    __shared__ float logits[DEC_SPLIT_MAX];
    __shared__ float red[DEC_WARPS];
    __shared__ __align__(16) float acc_sh[DEC_WARPS][MAX_HD];

    const int di = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seq = decode_seqs[di];
    const int row = seq_first_row[seq];
    const int pos = seq_start[seq];
    const int lo = first_visible(window, pos);
    const int begin = lo + split * split_len;
    const int n = min(split_len, pos + 1 - begin);  // may be <= 0: an empty split
    const int kvh = h / (n_heads / n_kv_heads);
    const long long kv_dim = (long long)n_kv_heads * head_dim;
    const int* table = tables + seq_table_off[seq];
    const typename KV::T* kbase = k_cache + (long long)kvh * head_dim;
    const typename KV::T* vbase = v_cache + (long long)kvh * head_dim;
    const long long q_off = (long long)row * n_heads * head_dim + (long long)h * head_dim;

    for (int d = tid; d < head_dim; d += DEC_THREADS) q_sh[d] = q[q_off + d];
    __syncthreads();

    // L lanes read one position's head row (chunk c = 8 values = 16 bytes per lane), P
    // positions per warp step.
    const int chunks = head_dim >> 3;
    int L = 1;
    while (L < chunks) L <<= 1;
    const int P = 32 / L;
    const int sub = lane / L, c = lane % L;
    const bool has_chunk = c < chunks;

    // Scores.
    float local_max = NEG_INF;
    for (int base = warp * P; base < n; base += DEC_WARPS * P) {  // warp-uniform
        const int t = base + sub;
        float dot = 0.0f;
        if (t < n && has_chunk) {
            const long long slot = slot_of(table, block_size, begin + t);
            float kk[8];
            KV::load8(kbase + slot * kv_dim + c * 8, kk);
            const float4 qa = *reinterpret_cast<const float4*>(q_sh + c * 8);
            const float4 qb = *reinterpret_cast<const float4*>(q_sh + c * 8 + 4);
            dot = qa.x * kk[0] + qa.y * kk[1] + qa.z * kk[2] + qa.w * kk[3] + qb.x * kk[4] +
                  qb.y * kk[5] + qb.z * kk[6] + qb.w * kk[7];
        }
        for (int off = L >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (t < n && c == 0) {
            const float s = cap_score(dot * scale, softcap);
            logits[t] = s;
            local_max = fmaxf(local_max, s);
        }
    }
    local_max = warp_max(local_max);
    if (lane == 0) red[warp] = local_max;
    __syncthreads();
    float mx = red[0];
    for (int w = 1; w < DEC_WARPS; ++w) mx = fmaxf(mx, red[w]);
    __syncthreads();  // red is reused below

    // Probabilities (unnormalised) and their sum.
    float local_sum = 0.0f;
    for (int t = tid; t < n; t += DEC_THREADS) {
        const float e = expf(logits[t] - mx);
        logits[t] = e;
        local_sum += e;
    }
    local_sum = warp_sum(local_sum);
    if (lane == 0) red[warp] = local_sum;
    __syncthreads();  // also publishes logits
    float sum = 0.0f;
    for (int w = 0; w < DEC_WARPS; ++w) sum += red[w];

    // p V: each lane keeps the 8 values of its chunk.
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    for (int base = warp * P; base < n; base += DEC_WARPS * P) {
        const int t = base + sub;
        if (t < n && has_chunk) {
            const long long slot = slot_of(table, block_size, begin + t);
            float vv[8];
            KV::load8(vbase + slot * kv_dim + c * 8, vv);
            const float p = logits[t];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] += p * vv[j];
        }
    }
    // Lanes with the same chunk (lane % L) hold different positions: sum them.
    for (int off = L; off < 32; off <<= 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
    }
    if (sub == 0 && has_chunk) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc_sh[warp][c * 8 + j] = acc[j];
    }
    __syncthreads();

    if (n_splits == 1) {
        // n >= 1 here (the query sees its own position), so sum > 0. A sink (gpt-oss) adds
        // its mass to the denominator only.
        const float sink = sinks ? expf(sinks[h] - mx) : 0.0f;
        const float inv = 1.0f / (sum + sink) * v_scale;
        for (int d = tid; d < head_dim; d += DEC_THREADS) {
            float a = 0.0f;
            for (int w = 0; w < DEC_WARPS; ++w) a += acc_sh[w][d];
            out[q_off + d] = a * inv;
        }
    } else {
        const long long part = ((long long)di * n_heads + h) * n_splits + split;
        for (int d = tid; d < head_dim; d += DEC_THREADS) {
            float a = 0.0f;
            for (int w = 0; w < DEC_WARPS; ++w) a += acc_sh[w][d];
            ws_acc[part * head_dim + d] = a * v_scale;
        }
        if (tid == 0) {
            ws_ml[part * 2] = mx;  // -inf for an empty split
            ws_ml[part * 2 + 1] = sum;
        }
    }
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
attn_decode(const float* q, const bf16_t* k_cache, const bf16_t* v_cache, float* out,
            float* ws_acc, float* ws_ml, const int* decode_seqs, const int* seq_first_row,
            const int* seq_start, const int* seq_table_off, const int* tables, int n_heads,
            int n_kv_heads, int head_dim, int block_size, float scale, float softcap,
            int window, int split_len, int n_splits, const float* sinks) {
    attn_decode_body<KvBf16>(q, k_cache, v_cache, out, ws_acc, ws_ml, decode_seqs,
                             seq_first_row, seq_start, seq_table_off, tables, n_heads,
                             n_kv_heads, head_dim, block_size, scale, softcap, window,
                             split_len, n_splits, 1.0f, sinks);
}

// `scale` already holds the keys' scale (q . k_scale code = (q . code) k_scale).
extern "C" __global__ void __launch_bounds__(DEC_THREADS)
attn_decode_fp8(const float* q, const fp8_t* k_cache, const fp8_t* v_cache, float* out,
                float* ws_acc, float* ws_ml, const int* decode_seqs, const int* seq_first_row,
                const int* seq_start, const int* seq_table_off, const int* tables,
                int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
                float softcap, int window, int split_len, int n_splits, float v_scale,
                const float* sinks) {
    attn_decode_body<KvFp8>(q, k_cache, v_cache, out, ws_acc, ws_ml, decode_seqs,
                            seq_first_row, seq_start, seq_table_off, tables, n_heads,
                            n_kv_heads, head_dim, block_size, scale, softcap, window,
                            split_len, n_splits, v_scale, sinks);
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
attn_decode_reduce(const float* ws_acc, const float* ws_ml, float* out, const int* decode_seqs,
                   const int* seq_first_row, int n_heads, int head_dim, int n_splits,
                   const float* sinks) {
    const int di = blockIdx.x, h = blockIdx.y;
    const int row = seq_first_row[decode_seqs[di]];
    const long long first = ((long long)di * n_heads + h) * n_splits;
    float m = NEG_INF;
    for (int s = 0; s < n_splits; ++s) m = fmaxf(m, ws_ml[(first + s) * 2]);
    float total = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
        const float ms = ws_ml[(first + s) * 2];
        if (ms != NEG_INF) total += expf(ms - m) * ws_ml[(first + s) * 2 + 1];
    }
    if (sinks) total += expf(sinks[h] - m);
    const float inv = 1.0f / total;
    const long long o = (long long)row * n_heads * head_dim + (long long)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; ++s) {
            const float ms = ws_ml[(first + s) * 2];
            if (ms != NEG_INF) a += expf(ms - m) * ws_acc[(first + s) * head_dim + d];
        }
        out[o + d] = a * inv;
    }
}

// --------------------------------------------------------------------------------- prefill

#define PF_THREADS 128
#define PF_WARPS 4
#define PF_BQ 16  // query rows per block
#define PF_BK 32  // positions per tile (= lanes of a warp)
#define PF_KV_STRIDE (MAX_HD + 2)  // padded: row j starts one bank after row j - 1
#define PF_DIMS (MAX_HD / PF_THREADS)  // output dims per thread

// tiles: pairs (sequence, first row of the tile within the sequence).
template <class KV>
__device__ __forceinline__ void attn_prefill_body(
    const float* q, const typename KV::T* k_cache, const typename KV::T* v_cache, float* out,
    const int* tiles, const int* seq_first_row, const int* seq_rows, const int* seq_start,
    const int* seq_table_off, const int* tables, int n_heads, int n_kv_heads, int head_dim,
    int block_size, float scale, float softcap, int window, float v_scale, const float* sinks) {
    __shared__ __align__(16) float q_sh[PF_BQ][MAX_HD];
    __shared__ __align__(16) bf16_t kv_sh[PF_BK][PF_KV_STRIDE];
    __shared__ float s_sh[PF_BQ][PF_BK + 1];
    __shared__ float m_sh[PF_BQ], l_sh[PF_BQ], corr_sh[PF_BQ];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y;
    const int seq = tiles[2 * blockIdx.x];
    const int r0 = tiles[2 * blockIdx.x + 1];
    const int nq = min(PF_BQ, seq_rows[seq] - r0);  // >= 1 (the host makes no empty tile)
    const int row0 = seq_first_row[seq] + r0;
    const int p0 = seq_start[seq] + r0;
    const int p_last = p0 + nq - 1;
    const int kvh = h / (n_heads / n_kv_heads);
    const long long kv_dim = (long long)n_kv_heads * head_dim;
    const long long q_stride = (long long)n_heads * head_dim;
    const int* table = tables + seq_table_off[seq];
    const typename KV::T* kbase = k_cache + (long long)kvh * head_dim;
    const typename KV::T* vbase = v_cache + (long long)kvh * head_dim;
    const int chunks = head_dim >> 3;

    for (int idx = tid; idx < PF_BQ * head_dim; idx += PF_THREADS) {
        const int i = idx / head_dim, d = idx % head_dim;
        q_sh[i][d] = i < nq ? q[(long long)(row0 + i) * q_stride + (long long)h * head_dim + d]
                            : 0.0f;
    }
    if (tid < PF_BQ) {
        m_sh[tid] = NEG_INF;
        l_sh[tid] = 0.0f;
        corr_sh[tid] = 0.0f;
    }

    float acc[PF_BQ][PF_DIMS];
#pragma unroll
    for (int i = 0; i < PF_BQ; ++i)
#pragma unroll
        for (int k = 0; k < PF_DIMS; ++k) acc[i][k] = 0.0f;

    // Positions [kv_lo, p_last]: the union of what the tile's rows see.
    const int kv_lo = first_visible(window, p0);
    for (int kt = kv_lo; kt <= p_last; kt += PF_BK) {  // block-uniform
        __syncthreads();  // the previous tile is done with kv_sh and s_sh (and q_sh is loaded)
        // K tile, 16-byte global loads; positions past p_last are zeros.
        for (int idx = tid; idx < PF_BK * chunks; idx += PF_THREADS) {
            const int j = idx / chunks, c = idx % chunks;
            const int p = kt + j;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (p <= p_last) {
                val = KV::load8_bf16(kbase + slot_of(table, block_size, p) * kv_dim + c * 8);
            }
            unsigned int* dst = reinterpret_cast<unsigned int*>(&kv_sh[j][c * 8]);
            dst[0] = val.x;
            dst[1] = val.y;
            dst[2] = val.z;
            dst[3] = val.w;
        }
        __syncthreads();
        // Scores: lane = position j of the tile, warp w = rows w, w + 4, w + 8, w + 12.
        {
            const int j = lane;
            const int p = kt + j;
            const unsigned int* krow = reinterpret_cast<const unsigned int*>(&kv_sh[j][0]);
#pragma unroll
            for (int rr = 0; rr < PF_BQ / PF_WARPS; ++rr) {
                const int i = warp + PF_WARPS * rr;
                float dot = 0.0f;
                for (int d2 = 0; d2 < (head_dim >> 1); ++d2) {
                    const unsigned int kk = krow[d2];
                    dot += q_sh[i][2 * d2] * bf16_lo(kk) + q_sh[i][2 * d2 + 1] * bf16_hi(kk);
                }
                const int pos_i = p0 + i;
                const bool valid = i < nq && p <= pos_i && p >= first_visible(window, pos_i);
                s_sh[i][j] = valid ? cap_score(dot * scale, softcap) : NEG_INF;
            }
        }
        __syncthreads();
        // V tile into kv_sh (K is no longer read), while each warp updates the softmax state
        // of its rows (lane = position).
        for (int idx = tid; idx < PF_BK * chunks; idx += PF_THREADS) {
            const int j = idx / chunks, c = idx % chunks;
            const int p = kt + j;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (p <= p_last) {
                val = KV::load8_bf16(vbase + slot_of(table, block_size, p) * kv_dim + c * 8);
            }
            unsigned int* dst = reinterpret_cast<unsigned int*>(&kv_sh[j][c * 8]);
            dst[0] = val.x;
            dst[1] = val.y;
            dst[2] = val.z;
            dst[3] = val.w;
        }
#pragma unroll
        for (int rr = 0; rr < PF_BQ / PF_WARPS; ++rr) {
            const int i = warp * (PF_BQ / PF_WARPS) + rr;
            const float s = s_sh[i][lane];
            const float m_old = m_sh[i];
            const float m_new = fmaxf(m_old, warp_max(s));
            const float p = (s == NEG_INF) ? 0.0f : expf(s - m_new);
            const float corr = (m_old == NEG_INF) ? 0.0f : expf(m_old - m_new);
            const float tile_sum = warp_sum(p);
            s_sh[i][lane] = p;
            // Every lane has read m_sh[i] before lane 0 overwrites it: the shuffles above
            // converge the lanes but do not order their shared-memory accesses.
            __syncwarp();
            if (lane == 0) {
                m_sh[i] = m_new;
                l_sh[i] = l_sh[i] * corr + tile_sum;
                corr_sh[i] = corr;
            }
        }
        __syncthreads();
        // acc = acc * corr + P V; thread owns dims tid + k * PF_THREADS.
#pragma unroll
        for (int k = 0; k < PF_DIMS; ++k) {
            const int d = tid + k * PF_THREADS;
            if (d < head_dim) {
#pragma unroll
                for (int i = 0; i < PF_BQ; ++i) acc[i][k] *= corr_sh[i];
                for (int j = 0; j < PF_BK; ++j) {
                    const float v = bf16_to_f32(kv_sh[j][d]);
#pragma unroll
                    for (int i = 0; i < PF_BQ; ++i) acc[i][k] += s_sh[i][j] * v;
                }
            }
        }
    }
    __syncthreads();  // l_sh final
#pragma unroll
    for (int k = 0; k < PF_DIMS; ++k) {
        const int d = tid + k * PF_THREADS;
        if (d < head_dim) {
#pragma unroll
            for (int i = 0; i < PF_BQ; ++i) {
                if (i < nq) {
                    const float sink = sinks ? expf(sinks[h] - m_sh[i]) : 0.0f;
                    out[(long long)(row0 + i) * q_stride + (long long)h * head_dim + d] =
                        acc[i][k] / (l_sh[i] + sink) * v_scale;
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
attn_prefill(const float* q, const bf16_t* k_cache, const bf16_t* v_cache, float* out,
             const int* tiles, const int* seq_first_row, const int* seq_rows,
             const int* seq_start, const int* seq_table_off, const int* tables, int n_heads,
             int n_kv_heads, int head_dim, int block_size, float scale, float softcap,
             int window, const float* sinks) {
    attn_prefill_body<KvBf16>(q, k_cache, v_cache, out, tiles, seq_first_row, seq_rows,
                              seq_start, seq_table_off, tables, n_heads, n_kv_heads, head_dim,
                              block_size, scale, softcap, window, 1.0f, sinks);
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
attn_prefill_fp8(const float* q, const fp8_t* k_cache, const fp8_t* v_cache, float* out,
                 const int* tiles, const int* seq_first_row, const int* seq_rows,
                 const int* seq_start, const int* seq_table_off, const int* tables,
                 int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
                 float softcap, int window, float v_scale, const float* sinks) {
    attn_prefill_body<KvFp8>(q, k_cache, v_cache, out, tiles, seq_first_row, seq_rows,
                             seq_start, seq_table_off, tables, n_heads, n_kv_heads, head_dim,
                             block_size, scale, softcap, window, v_scale, sinks);
}
