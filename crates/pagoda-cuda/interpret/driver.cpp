// The CUDA driver API calls Pagoda makes through cudarc, implemented on the host for the
// CUDA interpreter: one device (ordinal 0) named "Pagoda CUDA interpreter", compute
// capability 9.0 (PAGODA_CUDA_INTERPRET_CC=8.0 picks another), device memory as host
// allocations within a budget (PAGODA_CUDA_INTERPRET_MEMORY_GIB, default 2) (a device address is the host address), copies as memcpy, streams and events
// as ordered queues that run each operation when it is enqueued (so synchronising has nothing
// left to wait for), and kernel launches by name from the modules kernels.cpp registers.
//
// Invariants: a launch that breaks a CUDA limit fails with the code a GPU gives, and the
// message (cuGetErrorString) names the kernel and the limit; a pointer argument that is not
// in a live allocation fails the launch (CUDA_ERROR_ILLEGAL_ADDRESS) instead of being
// dereferenced; the library links against nothing CUDA.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef struct Module* CUmodule;
typedef const pagoda_interp::Kernel* CUfunction;

namespace {

constexpr CUresult SUCCESS = 0;
constexpr CUresult INVALID_VALUE = 1;
constexpr CUresult OUT_OF_MEMORY = 2;
constexpr CUresult NOT_INITIALIZED = 3;
constexpr CUresult INVALID_DEVICE = 101;
constexpr CUresult INVALID_IMAGE = 200;
constexpr CUresult INVALID_HANDLE = 400;
constexpr CUresult NOT_FOUND = 500;

bool initialised = false;
int context_token = 0;  // the primary context's handle points here
int stream_token = 0;

struct Event {
    bool recorded = false;
};

std::mutex handles_mutex;
std::set<void*>& streams() {
    static std::set<void*> s;
    return s;
}

CUresult fail(CUresult code, const std::string& message) {
    pagoda_interp::set_last_error(message);
    return code;
}

std::pair<int, int> capability() {
    const char* cc = std::getenv("PAGODA_CUDA_INTERPRET_CC");
    int major = 9, minor = 0;
    if (cc != nullptr) std::sscanf(cc, "%d.%d", &major, &minor);
    return {major, minor};
}

// The device's memory: PAGODA_CUDA_INTERPRET_MEMORY_GIB (default 2) GiB of host memory, so
// that what sizes itself by free device memory (the KV cache) stays small, and an allocation
// beyond it fails as on a GPU.
size_t device_bytes() {
    const char* gib = std::getenv("PAGODA_CUDA_INTERPRET_MEMORY_GIB");
    double g = gib != nullptr ? std::atof(gib) : 2.0;
    if (!(g > 0.0)) g = 2.0;
    return static_cast<size_t>(g * 1073741824.0);
}

size_t free_bytes() {
    const size_t used = pagoda_interp::device_allocated();
    return used >= device_bytes() ? 0 : device_bytes() - used;
}

bool is_device(CUdeviceptr p, size_t bytes) {
    return pagoda_interp::device_contains(static_cast<uintptr_t>(p), bytes);
}

std::string hex(unsigned long long v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", v);
    return buf;
}

}  // namespace

struct Module {
    std::vector<std::string> entries;
};

// ------------------------------------------------------------------ init, device, context

API CUresult cuInit(unsigned) {
    initialised = true;
    return SUCCESS;
}

API CUresult cuDriverGetVersion(int* version) {
    if (version == nullptr) return INVALID_VALUE;
    *version = 12080;
    return SUCCESS;
}

API CUresult cuDeviceGetCount(int* count) {
    if (!initialised) return NOT_INITIALIZED;
    *count = 1;
    return SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *device = 0;
    return SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "%s", "Pagoda CUDA interpreter (host CPU)");
    return SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    *bytes = device_bytes();
    return SUCCESS;
}

API CUresult cuDeviceGetUuid(unsigned char* uuid, CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    std::memcpy(uuid, "pagoda-interpret", 16);
    return SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(unsigned char* uuid, CUdevice device) {
    return cuDeviceGetUuid(uuid, device);
}

API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    const auto [major, minor] = capability();
    switch (attribute) {
        case 1: *value = 1024; break;             // max threads per block
        case 2: *value = 1024; break;             // max block x
        case 3: *value = 1024; break;             // max block y
        case 4: *value = 64; break;               // max block z
        case 5: *value = 2147483647; break;       // max grid x
        case 6: *value = 65535; break;            // max grid y
        case 7: *value = 65535; break;            // max grid z
        case 8: *value = 48 * 1024; break;        // shared memory per block
        case 10: *value = 32; break;              // warp size
        case 16: *value = 132; break;             // multiprocessors (an H100 SXM's)
        case 41: *value = 1; break;               // unified addressing
        case 75: *value = major; break;           // compute capability major
        case 76: *value = minor; break;           // compute capability minor
        case 81: *value = 228 * 1024; break;      // shared memory per multiprocessor
        case 97: *value = 227 * 1024; break;      // shared memory per block, opt-in
        case 115: *value = 0; break;              // memory pools: no (cudarc then uses cuMemAlloc)
        default: *value = 0; break;
    }
    return SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    *ctx = &context_token;
    return SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return device == 0 ? SUCCESS : INVALID_DEVICE;
}

API CUresult cuCtxSetCurrent(CUcontext) { return SUCCESS; }

API CUresult cuCtxGetCurrent(CUcontext* ctx) {
    *ctx = &context_token;
    return SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice* device) {
    *device = 0;
    return SUCCESS;
}

API CUresult cuCtxSynchronize() { return SUCCESS; }

API CUresult cuCtxPushCurrent_v2(CUcontext) { return SUCCESS; }

API CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
    if (ctx != nullptr) *ctx = &context_token;
    return SUCCESS;
}

API CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    if (least != nullptr) *least = 0;
    if (greatest != nullptr) *greatest = 0;
    return SUCCESS;
}

API CUresult cuGetErrorName(CUresult code, const char** name) {
    static const char* names[] = {"CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE",
                                  "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_NOT_INITIALIZED"};
    switch (code) {
        case 0: case 1: case 2: case 3: *name = names[code]; break;
        case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
        case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; break;
        case 400: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
        case 500: *name = "CUDA_ERROR_NOT_FOUND"; break;
        case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
        case 701: *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
        case 719: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
        default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return SUCCESS;
}

// The code's meaning and, after a failed call of this thread, what the interpreter saw.
API CUresult cuGetErrorString(CUresult code, const char** text) {
    static thread_local std::string message;
    const char* name = nullptr;
    cuGetErrorName(code, &name);
    message = name;
    const char* detail = pagoda_interp::last_error();
    if (code != SUCCESS && detail[0] != '\0') {
        message += " (CUDA interpreter: ";
        message += detail;
        message += ")";
    }
    *text = message.c_str();
    return SUCCESS;
}

// ---------------------------------------------------------------------- streams, events

API CUresult cuStreamCreate(CUstream* stream, unsigned) {
    std::lock_guard<std::mutex> g(handles_mutex);
    auto* s = new int(0);
    streams().insert(s);
    *stream = s;
    return SUCCESS;
}

API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned flags, int) {
    return cuStreamCreate(stream, flags);
}

namespace {
// The null stream, the legacy and per-thread ones (handles 0, 1, 2) and streams created.
bool is_stream(CUstream s) {
    if (s == nullptr || s == reinterpret_cast<CUstream>(1) ||
        s == reinterpret_cast<CUstream>(2) || s == &stream_token) {
        return true;
    }
    std::lock_guard<std::mutex> g(handles_mutex);
    return streams().count(s) != 0;
}
}  // namespace

API CUresult cuStreamDestroy_v2(CUstream stream) {
    std::lock_guard<std::mutex> g(handles_mutex);
    if (streams().erase(stream) == 0) return INVALID_HANDLE;
    delete static_cast<int*>(stream);
    return SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream stream) {
    return is_stream(stream) ? SUCCESS : INVALID_HANDLE;
}

API CUresult cuStreamQuery(CUstream stream) {
    return is_stream(stream) ? SUCCESS : INVALID_HANDLE;
}

API CUresult cuStreamWaitEvent(CUstream stream, CUevent, unsigned) {
    return is_stream(stream) ? SUCCESS : INVALID_HANDLE;
}

API CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void*), void* data) {
    if (!is_stream(stream)) return INVALID_HANDLE;
    fn(data);
    return SUCCESS;
}

API CUresult cuEventCreate(CUevent* event, unsigned) {
    *event = new Event;
    return SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent event) {
    delete static_cast<Event*>(event);
    return SUCCESS;
}

API CUresult cuEventRecord(CUevent event, CUstream stream) {
    if (!is_stream(stream)) return INVALID_HANDLE;
    static_cast<Event*>(event)->recorded = true;
    return SUCCESS;
}

API CUresult cuEventSynchronize(CUevent) { return SUCCESS; }
API CUresult cuEventQuery(CUevent) { return SUCCESS; }

API CUresult cuEventElapsedTime(float* ms, CUevent, CUevent) {
    *ms = 0.0f;
    return SUCCESS;
}

API CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
    return cuEventElapsedTime(ms, a, b);
}

// ------------------------------------------------------------------------------- memory

API CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
    if (bytes > free_bytes()) {
        return fail(OUT_OF_MEMORY, std::to_string(bytes) + " bytes asked, " +
                                       std::to_string(free_bytes()) +
                                       " free (PAGODA_CUDA_INTERPRET_MEMORY_GIB sets the size)");
    }
    void* p = pagoda_interp::device_alloc(bytes);
    if (p == nullptr) return fail(OUT_OF_MEMORY, std::to_string(bytes) + " bytes");
    *ptr = reinterpret_cast<CUdeviceptr>(p);
    return SUCCESS;
}

API CUresult cuMemAllocAsync(CUdeviceptr* ptr, size_t bytes, CUstream stream) {
    if (!is_stream(stream)) return INVALID_HANDLE;
    return cuMemAlloc_v2(ptr, bytes);
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (ptr == 0) return SUCCESS;
    if (!pagoda_interp::device_free(reinterpret_cast<void*>(ptr))) {
        return fail(INVALID_VALUE, "cuMemFree of " + hex(ptr) + ", not an allocation's start");
    }
    return SUCCESS;
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
    if (!is_stream(stream)) return INVALID_HANDLE;
    return cuMemFree_v2(ptr);
}

API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    *total = device_bytes();
    *free = free_bytes();
    return SUCCESS;
}

API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    *p = std::malloc(bytes == 0 ? 1 : bytes);
    return *p == nullptr ? OUT_OF_MEMORY : SUCCESS;
}

API CUresult cuMemFreeHost(void* p) {
    std::free(p);
    return SUCCESS;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    if (bytes == 0) return SUCCESS;
    if (!is_device(dst, bytes)) {
        return fail(INVALID_VALUE, "copy to host memory: " + std::to_string(bytes) +
                                       " bytes at " + hex(dst) + " are not device memory");
    }
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return SUCCESS;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
    if (!is_stream(s)) return INVALID_HANDLE;
    return cuMemcpyHtoD_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return SUCCESS;
    if (!is_device(src, bytes)) {
        return fail(INVALID_VALUE, "copy to the host: " + std::to_string(bytes) + " bytes at " +
                                       hex(src) + " are not device memory");
    }
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
    return SUCCESS;
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
    if (!is_stream(s)) return INVALID_HANDLE;
    return cuMemcpyDtoH_v2(dst, src, bytes);
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    if (bytes == 0) return SUCCESS;
    if (!is_device(src, bytes) || !is_device(dst, bytes)) {
        return fail(INVALID_VALUE, "device copy of " + std::to_string(bytes) + " bytes from " +
                                       hex(src) + " to " + hex(dst) + ": not device memory");
    }
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    return SUCCESS;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
    if (!is_stream(s)) return INVALID_HANDLE;
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    if (bytes == 0) return SUCCESS;
    if (!is_device(dst, bytes)) {
        return fail(INVALID_VALUE, "memset of " + std::to_string(bytes) + " bytes at " +
                                       hex(dst) + ": not device memory");
    }
    std::memset(reinterpret_cast<void*>(dst), value, bytes);
    return SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream s) {
    if (!is_stream(s)) return INVALID_HANDLE;
    return cuMemsetD8_v2(dst, value, bytes);
}

// ------------------------------------------------------------------- modules, launches

// A module image is PTX (the interpreter's NVRTC's, or a real one): its `.entry NAME(`
// lines name the kernels it holds, each of which must be one the interpreter was built with.
API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    const std::string text = static_cast<const char*>(image);
    auto* m = new Module;
    size_t at = 0;
    while ((at = text.find(".entry ", at)) != std::string::npos) {
        at += 7;
        const size_t end = text.find_first_of("( \n", at);
        if (end == std::string::npos) break;
        m->entries.push_back(text.substr(at, end - at));
    }
    if (m->entries.empty()) {
        delete m;
        return fail(INVALID_IMAGE, "the module image names no `.entry`");
    }
    *module = m;
    return SUCCESS;
}

API CUresult cuModuleUnload(CUmodule module) {
    delete module;
    return SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
    if (module == nullptr) return INVALID_HANDLE;
    bool listed = false;
    for (const auto& e : module->entries) listed |= e == name;
    const pagoda_interp::Kernel* k = pagoda_interp::find_kernel(name);
    if (!listed || k == nullptr) {
        return fail(NOT_FOUND, std::string("no kernel `") + name +
                                   "` in the module (or not one the interpreter was built with)");
    }
    *function = k;
    return SUCCESS;
}

API CUresult cuFuncGetAttribute(int* value, int attribute, CUfunction function) {
    if (function == nullptr) return INVALID_HANDLE;
    switch (attribute) {
        case 0:  // max threads per block
            *value = function->max_threads != 0 ? static_cast<int>(function->max_threads) : 1024;
            break;
        case 8: *value = 48 * 1024; break;  // max dynamic shared memory
        default: *value = 0; break;
    }
    return SUCCESS;
}

API CUresult cuFuncSetAttribute(CUfunction function, int, int) {
    return function == nullptr ? INVALID_HANDLE : SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, CUstream stream,
                            void** params, void** extra) {
    if (f == nullptr || !is_stream(stream)) return INVALID_HANDLE;
    if (extra != nullptr) return fail(INVALID_VALUE, "launch `extra` arguments are not interpreted");
    std::string error;
    const int code = pagoda_interp::launch(*f, {gx, gy, gz}, {bx, by, bz}, shared, params, &error);
    if (code != 0) {
        std::fprintf(stderr, "pagoda CUDA interpreter: launch failed: %s\n", error.c_str());
        return fail(code, error);
    }
    return SUCCESS;
}

// The interpreter's own report: bytes of device memory allocated now.
API size_t pagoda_interpret_allocated_bytes() { return pagoda_interp::device_allocated(); }
