// pagoda-cuda's kernel modules (src/kernels/*.cu), compiled unchanged for the host through
// cuda_host.h, each in its own namespace (their helpers share names), and every entry point
// registered for the interpreter's driver under its CUDA name. The lists below must name
// every entry point of kernels/mod.rs' MODULES; the interpreter's NVRTC reports the
// registered ones, and a test compares.
#include <string>
#include <utility>

#include "cuda_host.h"

namespace pagoda_elementwise {
#include "../src/kernels/elementwise.cu"
}
namespace pagoda_attention {
#include "../src/kernels/attention.cu"
}
namespace pagoda_quant {
#include "../src/kernels/quant.cu"
}

namespace pagoda_interp {
namespace {

template <class T>
struct Tag {
    using type = T;
};

template <class... A, size_t... I>
void call(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<typename std::remove_cv<A>::type*>(args[I])...);
}

template <class... A>
void invoke(void (*k)(A...), void** args) {
    call(k, args, std::index_sequence_for<A...>{});
}

// Why the pointer arguments are not all device addresses (null is allowed), or "".
template <class... A, size_t... I>
std::string check(void (*)(A...), void** args, std::index_sequence<I...>) {
    std::string why;
    auto one = [&](auto tag, size_t i) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_pointer<T>::value) {
            uintptr_t p;
            std::memcpy(&p, args[i], sizeof p);
            if (p != 0 && why.empty() && !device_contains(p, 0)) {
                char hex[32];
                std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(p));
                why = "argument " + std::to_string(i) + " (" + hex +
                      ") is not an address in device memory";
            }
        }
    };
    (one(Tag<A>{}, I), ...);
    return why;
}

template <class... A>
std::string check_pointers(void (*k)(A...), void** args) {
    return check(k, args, std::index_sequence_for<A...>{});
}

}  // namespace
}  // namespace pagoda_interp

#define PAGODA_KERNEL(module, ns, fn, bound)                                               \
    static const pagoda_interp::Kernel kernel_##fn = {                                      \
        module, #fn, [](void** a) { pagoda_interp::invoke(ns::fn, a); },                   \
        [](void** a) { return pagoda_interp::check_pointers(ns::fn, a); }, bound};          \
    static const bool registered_##fn = (pagoda_interp::register_kernel(&kernel_##fn), true);

#define ELEMENTWISE(fn) PAGODA_KERNEL("elementwise", pagoda_elementwise, fn, 0)
ELEMENTWISE(embed_bf16)
ELEMENTWISE(rms_norm)
ELEMENTWISE(add_f32)
ELEMENTWISE(add_bias)
ELEMENTWISE(silu_mul)
ELEMENTWISE(gelu_tanh_mul)
ELEMENTWISE(to_bf16)
ELEMENTWISE(softcap)
ELEMENTWISE(gather_rows)
ELEMENTWISE(rope)
ELEMENTWISE(kv_write)
ELEMENTWISE(kv_write_fp8)
ELEMENTWISE(scale_f32)
ELEMENTWISE(copy_columns)
ELEMENTWISE(scatter_add_rows)
ELEMENTWISE(swiglu_oai_mul)

PAGODA_KERNEL("attention", pagoda_attention, attn_decode, DEC_THREADS)
PAGODA_KERNEL("attention", pagoda_attention, attn_decode_reduce, DEC_THREADS)
PAGODA_KERNEL("attention", pagoda_attention, attn_prefill, PF_THREADS)
PAGODA_KERNEL("attention", pagoda_attention, attn_decode_fp8, DEC_THREADS)
PAGODA_KERNEL("attention", pagoda_attention, attn_prefill_fp8, PF_THREADS)

#define QUANT_FORMAT(f)                                                  \
    PAGODA_KERNEL("quant", pagoda_quant, qgemv_##f, GEMV_THREADS)        \
    PAGODA_KERNEL("quant", pagoda_quant, qdequant_##f, 0)                \
    PAGODA_KERNEL("quant", pagoda_quant, qembed_##f, 0)
QUANT_FORMAT(q8_0)
QUANT_FORMAT(q4_0)
QUANT_FORMAT(q4_1)
QUANT_FORMAT(q4_k)
QUANT_FORMAT(q5_k)
QUANT_FORMAT(q6_k)
QUANT_FORMAT(int8)
QUANT_FORMAT(int4_g64)
QUANT_FORMAT(int4_g64_sym)
QUANT_FORMAT(int4_g128)
QUANT_FORMAT(int4_g128_sym)
QUANT_FORMAT(nf4)
QUANT_FORMAT(nf4_dq)
QUANT_FORMAT(mxfp4)
PAGODA_KERNEL("quant", pagoda_quant, quantize_q8_act, 0)
PAGODA_KERNEL("quant", pagoda_quant, qgemv8_q8_0, GEMV_THREADS)
PAGODA_KERNEL("quant", pagoda_quant, qgemv8_int8, GEMV_THREADS)
