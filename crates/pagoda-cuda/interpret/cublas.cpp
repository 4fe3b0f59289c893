// cuBLAS for the CUDA interpreter: the handle calls and cublasGemmEx, written from cuBLAS's
// documented column-major rules as a plain reference GEMM:
//   C[i + j·ldc] = alpha · Σ_l op(A)[i, l] · op(B)[l, j] + beta · C[i + j·ldc]
// with op(A)[i, l] = A[i + l·lda] (CUBLAS_OP_N) or A[l + i·lda] (CUBLAS_OP_T), inputs in
// bf16, f16 or f32, C in f32 or bf16, accumulated in f32 in order of l. beta = 0 ignores C's
// old contents (even NaN), as cuBLAS does.
//
// Invariants: the leading dimensions are checked as cuBLAS checks them
// (CUBLAS_STATUS_INVALID_VALUE), and every matrix's extent must lie in one device allocation
// (CUBLAS_STATUS_EXECUTION_FAILED otherwise, where a GPU would fault).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int cublasStatus_t;
struct Handle {
    void* stream = nullptr;
};
typedef Handle* cublasHandle_t;

namespace {
constexpr cublasStatus_t SUCCESS = 0;
constexpr cublasStatus_t NOT_INITIALIZED = 1;
constexpr cublasStatus_t INVALID_VALUE = 7;
constexpr cublasStatus_t EXECUTION_FAILED = 13;
constexpr cublasStatus_t NOT_SUPPORTED = 15;

constexpr int R_32F = 0, R_16F = 2, R_16BF = 14;
constexpr int OP_N = 0, OP_T = 1;

size_t element_bytes(int type) { return type == R_32F ? 4 : 2; }

float half_to_float(uint16_t h) {
    const unsigned s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                    : e == 31 ? (m ? NAN : INFINITY)
                              : std::ldexp(static_cast<float>(m | 1024), static_cast<int>(e) - 25);
    return s ? -v : v;
}

float load(const void* base, int type, size_t i) {
    if (type == R_32F) {
        float f;
        std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(base) + 2 * i, 2);
    if (type == R_16F) return half_to_float(h);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

void store(void* base, int type, size_t i, float v) {
    if (type == R_32F) {
        std::memcpy(static_cast<char*>(base) + 4 * i, &v, 4);
        return;
    }
    uint32_t u;
    std::memcpy(&u, &v, 4);
    // Round to nearest even, NaN kept quiet.
    uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
                     ? static_cast<uint16_t>((u >> 16) | 0x40u)
                     : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    std::memcpy(static_cast<char*>(base) + 2 * i, &h, 2);
}

// Whether a column-major `rows × cols` matrix with leading dimension `ld` lies in device memory.
bool in_device(const void* p, int type, int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return true;
    const size_t elements = static_cast<size_t>(ld) * static_cast<size_t>(cols - 1) +
                            static_cast<size_t>(rows);
    return pagoda_interp::device_contains(reinterpret_cast<uintptr_t>(p),
                                          elements * element_bytes(type));
}

cublasStatus_t fail(cublasStatus_t code, const std::string& why) {
    std::fprintf(stderr, "pagoda CUDA interpreter: cublasGemmEx: %s\n", why.c_str());
    pagoda_interp::set_last_error("cublasGemmEx: " + why);
    return code;
}
}  // namespace

API cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    *handle = new Handle;
    return SUCCESS;
}

API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    delete handle;
    return SUCCESS;
}

API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, void* stream) {
    if (handle == nullptr) return NOT_INITIALIZED;
    handle->stream = stream;
    return SUCCESS;
}

API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, void** stream) {
    if (handle == nullptr) return NOT_INITIALIZED;
    *stream = handle->stream;
    return SUCCESS;
}

API cublasStatus_t cublasGetVersion_v2(cublasHandle_t, int* version) {
    *version = 0;
    return SUCCESS;
}

// libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL; the interpreter is 0.0.0.
API cublasStatus_t cublasGetProperty(int type, int* value) {
    if (value == nullptr || type < 0 || type > 2) return INVALID_VALUE;
    *value = 0;
    return SUCCESS;
}

API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int) {
    return handle == nullptr ? NOT_INITIALIZED : SUCCESS;
}

API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void*, size_t) {
    return handle == nullptr ? NOT_INITIALIZED : SUCCESS;
}

API const char* cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
        case SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

API const char* cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }

API cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                const void* alpha, const void* a, int atype, int lda,
                                const void* b, int btype, int ldb, const void* beta, void* c,
                                int ctype, int ldc, int compute, int) {
    if (handle == nullptr) return NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || (transa != OP_N && transa != OP_T) ||
        (transb != OP_N && transb != OP_T)) {
        return fail(INVALID_VALUE, "bad sizes or operations");
    }
    // op(A) is m × k, op(B) is k × n; as stored, A is (transa ? k × m : m × k).
    const int a_rows = transa == OP_N ? m : k, a_cols = transa == OP_N ? k : m;
    const int b_rows = transb == OP_N ? k : n, b_cols = transb == OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) ||
        ldc < (m > 1 ? m : 1)) {
        return fail(INVALID_VALUE, "a leading dimension is less than its matrix's rows (lda " +
                                       std::to_string(lda) + ", ldb " + std::to_string(ldb) +
                                       ", ldc " + std::to_string(ldc) + ")");
    }
    for (int t : {atype, btype}) {
        if (t != R_32F && t != R_16F && t != R_16BF) return fail(NOT_SUPPORTED, "input type");
    }
    if (ctype != R_32F && ctype != R_16BF) return fail(NOT_SUPPORTED, "output type");
    // CUBLAS_COMPUTE_32F (68) and its fast variants (74-77): f32 scalars.
    if (compute != 68 && (compute < 74 || compute > 77)) {
        return fail(NOT_SUPPORTED, "compute type " + std::to_string(compute));
    }
    if (m == 0 || n == 0) return SUCCESS;
    if (!in_device(a, atype, a_rows, a_cols, lda) || !in_device(b, btype, b_rows, b_cols, ldb) ||
        !in_device(c, ctype, m, n, ldc)) {
        return fail(EXECUTION_FAILED, "a matrix's extent is not in device memory (m " +
                                          std::to_string(m) + ", n " + std::to_string(n) +
                                          ", k " + std::to_string(k) + ")");
    }
    float al, be;
    std::memcpy(&al, alpha, 4);
    std::memcpy(&be, beta, 4);
    for (int j = 0; j < n; ++j) {
        for (int i = 0; i < m; ++i) {
            float sum = 0.0f;
            for (int l = 0; l < k; ++l) {
                const size_t ai = transa == OP_N ? i + static_cast<size_t>(l) * lda
                                                 : l + static_cast<size_t>(i) * lda;
                const size_t bi = transb == OP_N ? l + static_cast<size_t>(j) * ldb
                                                 : j + static_cast<size_t>(l) * ldb;
                sum += load(a, atype, ai) * load(b, btype, bi);
            }
            const size_t ci = i + static_cast<size_t>(j) * ldc;
            const float old = be == 0.0f ? 0.0f : be * load(c, ctype, ci);
            store(c, ctype, ci, al * sum + old);
        }
    }
    return SUCCESS;
}
