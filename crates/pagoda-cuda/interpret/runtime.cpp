// The CUDA interpreter's execution: device memory, the kernel registry, and running a grid
// (runtime.h says the model). Fibers switch with a few instructions of x86-64 assembly
// (pagoda_interp_switch), with the AddressSanitizer fiber annotations when built with it; PAGODA_INTERP_THREADS runs each CUDA thread as an OS
// thread instead (slow; for ThreadSanitizer, which then sees the barriers as the only order
// between threads).
#include "runtime.h"

#include <sys/mman.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>
#include <algorithm>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define PAGODA_ASAN 1
#endif

namespace pagoda_interp {

// ------------------------------------------------------------------------- device memory

namespace {
std::mutex memory_mutex;
std::map<uintptr_t, size_t>& allocations() {
    static std::map<uintptr_t, size_t> m;
    return m;
}
size_t allocated_bytes = 0;
}  // namespace

void* device_alloc(size_t bytes) {
    void* p = nullptr;
    // 256-byte aligned as cuMemAlloc's; uninitialised device memory reads as NaN (0xff
    // bytes) so that a kernel reading what nothing wrote shows in its results.
    if (posix_memalign(&p, 256, bytes == 0 ? 1 : bytes) != 0) return nullptr;
    std::memset(p, 0xff, bytes);
    std::lock_guard<std::mutex> g(memory_mutex);
    allocations()[reinterpret_cast<uintptr_t>(p)] = bytes;
    allocated_bytes += bytes;
    return p;
}

bool device_free(void* p) {
    {
        std::lock_guard<std::mutex> g(memory_mutex);
        auto it = allocations().find(reinterpret_cast<uintptr_t>(p));
        if (it == allocations().end()) return false;
        allocated_bytes -= it->second;
        allocations().erase(it);
    }
    std::free(p);
    return true;
}

bool device_contains(uintptr_t p, size_t bytes) {
    std::lock_guard<std::mutex> g(memory_mutex);
    auto& m = allocations();
    auto it = m.upper_bound(p);
    if (it == m.begin()) return false;
    --it;
    const uintptr_t end = it->first + it->second;
    return p >= it->first && p <= end && bytes <= end - p;
}

size_t device_allocated() {
    std::lock_guard<std::mutex> g(memory_mutex);
    return allocated_bytes;
}

// ------------------------------------------------------------------------------ registry

namespace {
std::unordered_map<std::string, const Kernel*>& registry() {
    static std::unordered_map<std::string, const Kernel*> r;
    return r;
}
thread_local std::string last_error_message;
}  // namespace

void register_kernel(const Kernel* k) { registry()[k->name] = k; }

const Kernel* find_kernel(const char* name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : it->second;
}

void set_last_error(const std::string& message) { last_error_message = message; }
const char* last_error() { return last_error_message.c_str(); }

// ----------------------------------------------------------------------- block execution

namespace {

constexpr unsigned WARP = 32;
constexpr unsigned MAX_THREADS = 1024;

// What the threads of the running block share: the barrier, and per warp its exchange slots.
struct Warp {
    unsigned size = 0;     // lanes in this warp (the last warp of a block may be short)
    unsigned arrived = 0;  // lanes at the current warp sync
    unsigned generation = 0;
    uint64_t slots[WARP] = {};
};

struct Block {
    unsigned threads = 0;
    unsigned arrived = 0;
    unsigned generation = 0;
    Warp warps[MAX_THREADS / WARP];
    // A reason the block cannot go on (set by a thread; the launch reports it).
    std::string fault;
};

Block block;
thread_local ThreadState* current_thread = nullptr;

// Where a thread waits, for the report of a block that cannot go on.
enum class Wait { Running, Barrier, Warp, Done };

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "pagoda CUDA interpreter: %s\n", what);
    std::abort();
}

#if !defined(PAGODA_INTERP_THREADS)

// --------------------------------------------------------------------------------- fibers

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t GUARD_BYTES = 4096;

// A context switch: the callee-saved registers pushed on the current stack, the stack
// pointer saved to *from and loaded from `to`, and the registers popped there. glibc's
// swapcontext also saves the signal mask with a system call per switch, which made a
// barrier-heavy kernel spend most of its time in the kernel; the fibers never change it.
struct Context {
    void* sp = nullptr;
};
extern "C" void pagoda_interp_switch(void** from, void* to);
asm(R"(
    .text
    .globl pagoda_interp_switch
    .hidden pagoda_interp_switch
    .type pagoda_interp_switch, @function
pagoda_interp_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pagoda_interp_switch, .-pagoda_interp_switch
)");

struct Fiber {
    Context context;
    char* stack = nullptr;  // the usable stack, above a guard page
    ThreadState state;
    Wait wait = Wait::Running;
};

std::vector<Fiber*> fibers;
Context scheduler;
Fiber* running = nullptr;
const Kernel* running_kernel = nullptr;
void** running_args = nullptr;
// Bumped whenever a thread arrives at a sync point, passes one or ends: a round of the
// scheduler that does not move it is a deadlock.
unsigned long long progress = 0;

#if defined(PAGODA_ASAN)
void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

Fiber* fiber(unsigned i) {
    while (fibers.size() <= i) {
        auto* f = new Fiber;
        void* mem = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) die("cannot map a fiber stack");
        // A guard page below the stack: an overflow faults instead of corrupting.
        mprotect(mem, GUARD_BYTES, PROT_NONE);
        f->stack = static_cast<char*>(mem) + GUARD_BYTES;
        fibers.push_back(f);
    }
    return fibers[i];
}

// Switches from the running fiber back to the scheduler.
void yield() {
    Fiber* self = running;
#if defined(PAGODA_ASAN)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, scheduler_stack_bottom, scheduler_stack_size);
#endif
    pagoda_interp_switch(&self->context.sp, scheduler.sp);
#if defined(PAGODA_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

[[noreturn]] void fiber_main() {
#if defined(PAGODA_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, const_cast<const void**>(&scheduler_stack_bottom),
                                    &scheduler_stack_size);
#endif
    running_kernel->invoke(running_args);
    running->wait = Wait::Done;
    ++progress;
#if defined(PAGODA_ASAN)
    // This fiber's stack is done with: nullptr tells ASan to forget its fake frames.
    __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom, scheduler_stack_size);
#endif
    // Back to the scheduler for good (it never resumes a finished fiber).
    void* unused;
    pagoda_interp_switch(&unused, scheduler.sp);
    die("a finished fiber was resumed");
}

// The stack of a new fiber: what pagoda_interp_switch pops (six registers, zero) and then
// returns to, fiber_main, entered with the stack aligned as after a call.
void* initial_stack(char* stack) {
#if defined(PAGODA_ASAN)
    // The stack is reused from block to block: the frames of its last fiber left their
    // redzones poisoned, and the new fiber's frames would be reported as overflows.
    __asan_unpoison_memory_region(stack, STACK_BYTES);
#endif
    auto* top = reinterpret_cast<uintptr_t*>(
        (reinterpret_cast<uintptr_t>(stack + STACK_BYTES) & ~uintptr_t{15}));
    *--top = 0;  // fiber_main's return address slot: never used (it does not return)
    *--top = reinterpret_cast<uintptr_t>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--top = 0;
    return top;
}

void resume(Fiber* f) {
    running = f;
    current_thread = &f->state;
#if defined(PAGODA_ASAN)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
#endif
    pagoda_interp_switch(&scheduler.sp, f->context.sp);
#if defined(PAGODA_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    running = nullptr;
    current_thread = nullptr;
}

// Runs one block; returns an empty string or why it could not finish.
std::string run_block(const Kernel& k, void** args, Dim3 grid, Dim3 dims, Dim3 index) {
    const unsigned n = dims.x * dims.y * dims.z;
    running_kernel = &k;
    running_args = args;
    for (unsigned t = 0; t < n; ++t) {
        Fiber* f = fiber(t);
        f->wait = Wait::Running;
        f->state.block_dim = dims;
        f->state.grid_dim = grid;
        f->state.block_idx = index;
        f->state.linear = t;
        f->state.thread_idx = Dim3{t % dims.x, (t / dims.x) % dims.y, t / (dims.x * dims.y)};
        f->context.sp = initial_stack(f->stack);
    }
    unsigned live = n;
    while (live > 0) {
        const unsigned long long before = progress;
        for (unsigned t = 0; t < n; ++t) {
            Fiber* f = fibers[t];
            if (f->wait == Wait::Done) continue;
            resume(f);
            if (f->wait == Wait::Done) --live;
            if (!block.fault.empty()) return block.fault;
        }
        if (live > 0 && progress == before) {
            unsigned at_barrier = 0, at_warp = 0, done = 0;
            for (unsigned t = 0; t < n; ++t) {
                at_barrier += fibers[t]->wait == Wait::Barrier;
                at_warp += fibers[t]->wait == Wait::Warp;
                done += fibers[t]->wait == Wait::Done;
            }
            return "threads wait forever: " + std::to_string(at_barrier) +
                   " at __syncthreads, " + std::to_string(at_warp) +
                   " at a warp-synchronous operation, " + std::to_string(done) +
                   " finished without reaching them (a barrier or shuffle in divergent code)";
        }
    }
    return {};
}

// Waits (yielding) until `generation` moves on.
void wait_for(const unsigned& generation, unsigned seen, Wait why) {
    running->wait = why;
    while (generation == seen) yield();
    running->wait = Wait::Running;
}

#else  // PAGODA_INTERP_THREADS

// ------------------------------------------------------------------------- OS threads

std::mutex block_mutex;
std::condition_variable block_cv;

std::string run_block(const Kernel& k, void** args, Dim3 grid, Dim3 dims, Dim3 index) {
    const unsigned n = dims.x * dims.y * dims.z;
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned t = 0; t < n; ++t) {
        threads.emplace_back([&, t] {
            ThreadState s;
            s.block_dim = dims;
            s.grid_dim = grid;
            s.block_idx = index;
            s.linear = t;
            s.thread_idx = Dim3{t % dims.x, (t / dims.x) % dims.y, t / (dims.x * dims.y)};
            current_thread = &s;
            k.invoke(args);
            current_thread = nullptr;
        });
    }
    for (auto& t : threads) t.join();
    return block.fault;
}

void wait_for(const unsigned& generation, unsigned seen, std::unique_lock<std::mutex>& lock) {
    const bool passed = block_cv.wait_for(lock, std::chrono::seconds(30),
                                          [&] { return generation != seen; });
    if (!passed) die("a barrier or warp sync waited 30 s: divergent code");
}

#endif

}  // namespace

ThreadState& current() {
    if (current_thread == nullptr) die("a CUDA built-in was used outside a kernel");
    return *current_thread;
}

void syncthreads() {
#if !defined(PAGODA_INTERP_THREADS)
    const unsigned seen = block.generation;
    ++progress;
    if (++block.arrived == block.threads) {
        block.arrived = 0;
        ++block.generation;
        return;
    }
    wait_for(block.generation, seen, Wait::Barrier);
#else
    std::unique_lock<std::mutex> lock(block_mutex);
    const unsigned seen = block.generation;
    if (++block.arrived == block.threads) {
        block.arrived = 0;
        ++block.generation;
        block_cv.notify_all();
        return;
    }
    wait_for(block.generation, seen, lock);
#endif
}

namespace {
// Every lane of this thread's warp arrives here before any goes on.
void warp_barrier(Warp& w) {
#if !defined(PAGODA_INTERP_THREADS)
    const unsigned seen = w.generation;
    ++progress;
    if (++w.arrived == w.size) {
        w.arrived = 0;
        ++w.generation;
        return;
    }
    wait_for(w.generation, seen, Wait::Warp);
#else
    std::unique_lock<std::mutex> lock(block_mutex);
    const unsigned seen = w.generation;
    if (++w.arrived == w.size) {
        w.arrived = 0;
        ++w.generation;
        block_cv.notify_all();
        return;
    }
    wait_for(w.generation, seen, lock);
#endif
}

Warp& my_warp(unsigned* lane) {
    const unsigned t = current().linear;
    *lane = t % WARP;
    return block.warps[t / WARP];
}

void fault(const std::string& why) {
    if (block.fault.empty()) block.fault = why;
}
}  // namespace

void syncwarp(unsigned mask) {
    unsigned lane;
    Warp& w = my_warp(&lane);
    if (mask != 0xffffffffu) fault("__syncwarp with a partial mask is not interpreted");
    if (w.size != WARP) fault("__syncwarp in a warp of " + std::to_string(w.size) + " threads");
    warp_barrier(w);
}

uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lanemask, int width) {
    unsigned lane;
    Warp& w = my_warp(&lane);
    if (mask != 0xffffffffu || width != 32) {
        fault("__shfl_xor_sync with a partial mask or width is not interpreted");
    }
    if (w.size != WARP) {
        fault("__shfl_xor_sync over all 32 lanes in a warp of " + std::to_string(w.size) +
              " threads (the block size is not a multiple of 32)");
    }
    w.slots[lane] = bits;
    warp_barrier(w);
    const uint64_t got = w.slots[(lane ^ static_cast<unsigned>(lanemask)) % WARP];
    warp_barrier(w);
    return got;
}

// --------------------------------------------------------------------------------- grid

namespace {
std::mutex launch_mutex;
}

int launch(const Kernel& k, Dim3 grid, Dim3 dims, unsigned dynamic_shared, void** args,
           std::string* error) {
    constexpr int INVALID_VALUE = 1;
    constexpr int ILLEGAL_ADDRESS = 700;
    constexpr int LAUNCH_OUT_OF_RESOURCES = 701;
    constexpr int LAUNCH_FAILED = 719;
    const std::string name = k.name;
    const unsigned long long threads =
        static_cast<unsigned long long>(dims.x) * dims.y * dims.z;
    // The limits of compute capability 8.0-9.0.
    if (dims.x == 0 || dims.y == 0 || dims.z == 0 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0) {
        *error = name + ": a grid or block dimension is 0";
        return INVALID_VALUE;
    }
    if (dims.x > 1024 || dims.y > 1024 || dims.z > 64 || threads > MAX_THREADS) {
        *error = name + ": block (" + std::to_string(dims.x) + ", " + std::to_string(dims.y) +
                 ", " + std::to_string(dims.z) + ") exceeds 1024 threads or a dimension limit";
        return INVALID_VALUE;
    }
    if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        *error = name + ": grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) +
                 ", " + std::to_string(grid.z) + ") exceeds the grid limits";
        return INVALID_VALUE;
    }
    if (dynamic_shared > 48 * 1024) {
        *error = name + ": " + std::to_string(dynamic_shared) +
                 " bytes of dynamic shared memory without the opt-in (48 KiB at most)";
        return INVALID_VALUE;
    }
    if (k.max_threads != 0 && threads > k.max_threads) {
        *error = name + ": " + std::to_string(threads) + " threads per block, but its " +
                 "__launch_bounds__ allow " + std::to_string(k.max_threads);
        return LAUNCH_OUT_OF_RESOURCES;
    }
    const std::string bad = k.check_pointers(args);
    if (!bad.empty()) {
        *error = name + ": " + bad;
        return ILLEGAL_ADDRESS;
    }
    std::lock_guard<std::mutex> g(launch_mutex);
    block.threads = static_cast<unsigned>(threads);
    for (unsigned w = 0; w < MAX_THREADS / WARP; ++w) {
        const unsigned first = w * WARP;
        block.warps[w].size =
            first >= threads ? 0 : static_cast<unsigned>(std::min<unsigned long long>(WARP, threads - first));
    }
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                block.arrived = 0;
                block.fault.clear();
                for (auto& w : block.warps) w.arrived = 0;
                const std::string why = run_block(k, args, grid, dims, Dim3{x, y, z});
                if (!why.empty()) {
                    *error = name + ", block (" + std::to_string(x) + ", " + std::to_string(y) +
                             ", " + std::to_string(z) + "): " + why;
                    return LAUNCH_FAILED;
                }
            }
        }
    }
    return 0;
}

}  // namespace pagoda_interp

namespace pagoda_interp {
std::vector<std::string> module_kernels(const char* module) {
    std::vector<std::string> names;
    for (const auto& [name, k] : registry()) {
        if (std::strcmp(k->module, module) == 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
}
}  // namespace pagoda_interp
