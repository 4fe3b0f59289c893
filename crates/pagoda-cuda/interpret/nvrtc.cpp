// NVRTC for the CUDA interpreter: "compiling" a kernel module checks that its source is one
// the interpreter was built with (by its FNV-1a hash, which build.rs passes in as
// PAGODA_MODULE_HASHES) and answers a PTX text whose `.entry` lines name that module's
// registered kernels; the interpreter's cuModuleLoadData reads them back. Any other source
// fails to compile with a log that says so.
//
// Invariant: the version reported (0.0) is no real NVRTC's, so a kernel cache keyed by the
// NVRTC version never mixes this PTX with a GPU's.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int nvrtcResult;
struct Program {
    std::string source, name, ptx, log;
};
typedef Program* nvrtcProgram;

namespace pagoda_interp {
// Names of the kernels of one module (kernels.cpp registers them).
std::vector<std::string> module_kernels(const char* module);
}

namespace {
constexpr nvrtcResult SUCCESS = 0;
constexpr nvrtcResult INVALID_INPUT = 3;
constexpr nvrtcResult INVALID_PROGRAM = 4;
constexpr nvrtcResult COMPILATION = 6;

struct Known {
    const char* module;
    uint64_t hash;
};
// PAGODA_MODULE_HASHES expands to {"elementwise", 0x...ull}, ... (build.rs).
const Known KNOWN[] = {PAGODA_MODULE_HASHES};

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}
}  // namespace

API const char* nvrtcGetErrorString(nvrtcResult r) {
    switch (r) {
        case SUCCESS: return "NVRTC_SUCCESS";
        case INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
        case INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
        case COMPILATION: return "NVRTC_ERROR_COMPILATION";
        default: return "NVRTC_ERROR_INTERNAL_ERROR";
    }
}

API nvrtcResult nvrtcVersion(int* major, int* minor) {
    *major = 0;
    *minor = 0;
    return SUCCESS;
}

API nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int,
                                   const char* const*, const char* const*) {
    if (prog == nullptr || src == nullptr) return INVALID_INPUT;
    *prog = new Program{src, name != nullptr ? name : "default_program", "", ""};
    return SUCCESS;
}

API nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
    if (prog == nullptr) return INVALID_PROGRAM;
    delete *prog;
    *prog = nullptr;
    return SUCCESS;
}

API nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char* const* options) {
    if (prog == nullptr) return INVALID_PROGRAM;
    std::string arch = "sm_90";
    for (int i = 0; i < n; ++i) {
        const std::string o = options[i];
        for (const char* flag : {"--gpu-architecture=", "-arch="}) {
            if (o.rfind(flag, 0) == 0) arch = o.substr(std::strlen(flag));
        }
    }
    const uint64_t h = fnv1a(prog->source);
    for (const Known& k : KNOWN) {
        if (k.hash != h) continue;
        std::string ptx = "// Pagoda CUDA interpreter: module ";
        ptx += k.module;
        ptx += " (host code, not PTX)\n.version 0.0\n.target " + arch + "\n.address_size 64\n\n";
        for (const std::string& e : pagoda_interp::module_kernels(k.module)) {
            ptx += ".visible .entry " + e + "(\n)\n{\n}\n";
        }
        prog->ptx = ptx;
        prog->log.clear();
        return SUCCESS;
    }
    prog->log = prog->name +
                ": the CUDA interpreter runs only the kernel modules it was built with "
                "(pagoda-cuda's src/kernels/*.cu, unchanged); this source is not one of them";
    return COMPILATION;
}

API nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* size) {
    if (prog == nullptr) return INVALID_PROGRAM;
    *size = prog->ptx.size() + 1;
    return SUCCESS;
}

API nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* out) {
    if (prog == nullptr) return INVALID_PROGRAM;
    std::memcpy(out, prog->ptx.c_str(), prog->ptx.size() + 1);
    return SUCCESS;
}

API nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* size) {
    if (prog == nullptr) return INVALID_PROGRAM;
    *size = prog->log.size() + 1;
    return SUCCESS;
}

API nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* out) {
    if (prog == nullptr) return INVALID_PROGRAM;
    std::memcpy(out, prog->log.c_str(), prog->log.size() + 1);
    return SUCCESS;
}
