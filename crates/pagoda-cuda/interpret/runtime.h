// The CUDA interpreter's execution model, shared by the emulation header (what kernel code
// sees: thread and block indices, barriers, warp shuffles) and the driver (what launches a
// grid and owns device memory).
//
// A launch runs its blocks one after another on the calling OS thread; the threads of a
// block run as cooperative fibers (or, built with PAGODA_INTERP_THREADS for ThreadSanitizer,
// as OS threads). A fiber runs until it reaches a barrier, a warp-synchronous operation or its
// end, then the next one runs, so a missing barrier shows as a wrong result instead of going
// unnoticed by luck of timing. A barrier that not every thread of the block reaches, or a
// warp operation that not every lane reaches, ends the launch with an error naming the
// kernel and the block (the GPU would hang or compute garbage).
//
// Invariants: one grid runs at a time in the process (launches are serialised by a mutex:
// `__shared__` storage is one static array per kernel); kernel code reads its indices only
// through `current()`, which is valid only while a kernel runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagoda_interp {

struct Dim3 {
    unsigned x, y, z;
};

// What one CUDA thread of the running kernel sees.
struct ThreadState {
    Dim3 thread_idx, block_idx, block_dim, grid_dim;
    unsigned linear;  // thread_idx in the block, x fastest
};

// The running thread's state (valid only inside a kernel).
ThreadState& current();

void syncthreads();
void syncwarp(unsigned mask);
// The value of `bits` held by lane (this lane ^ lanemask) of this warp.
uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lanemask, int width);

// Device memory: allocations are host memory; a device address is its host address.
void* device_alloc(size_t bytes);
bool device_free(void* p);
// Whether [p, p + bytes) lies in one live allocation.
bool device_contains(uintptr_t p, size_t bytes);
// Bytes allocated now.
size_t device_allocated();

// One kernel: its name, how to call it with a launch's argument array, how to check the
// pointer arguments, and the block size its __launch_bounds__ allows (0: none given).
struct Kernel {
    const char* module;
    const char* name;
    void (*invoke)(void** args);
    // Empty, or why an argument is not a device address.
    std::string (*check_pointers)(void** args);
    unsigned max_threads;
};

const Kernel* find_kernel(const char* name);
void register_kernel(const Kernel* k);

// Runs a grid. Returns 0, or a CUDA error code with `error` set.
int launch(const Kernel& k, Dim3 grid, Dim3 block, unsigned dynamic_shared, void** args,
           std::string* error);

// The last error message of this OS thread (for cuGetErrorString-style reports).
void set_last_error(const std::string& message);
const char* last_error();

}  // namespace pagoda_interp
