//! The CUDA interpreter refuses what a GPU refuses, naming the kernel and the limit: a block
//! over 1024 threads, a grid over its limits, dynamic shared memory over 48 KiB without the
//! opt-in, more threads than a kernel's `__launch_bounds__`, a pointer argument that is not
//! device memory, a full-warp shuffle in a partial warp (here: a block not a multiple of 32);
//! a launch within the limits computes what pagoda-kernels does. Launched through cudarc as
//! `ops.rs` does, on the interpreter this test process loads itself (it needs no GPU, and
//! skips only in a build without the interpreter, which CI never is).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use pagoda_cuda::kernels::{ATTENTION, ELEMENTWISE};
use pagoda_cuda::{interpret, GpuContext, KernelCache};
use std::sync::Arc;

/// The interpreter's context and the functions `names` of `module`, or `None` (skipped).
fn interpreter(
    module: &pagoda_cuda::kernels::KernelModule,
    names: &[&str],
) -> Option<(Arc<CudaStream>, Vec<CudaFunction>)> {
    if !interpret::built() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI builds the CUDA interpreter"
        );
        eprintln!("skipped: this build has no CUDA interpreter");
        return None;
    }
    interpret::install().expect("the interpreter loads");
    let dir = tempfile::tempdir().expect("tempdir");
    let gpu = GpuContext::new(0, &KernelCache::new(dir.path())).expect("the interpreter's device");
    assert!(gpu.gpu().interpreted);
    let stream = gpu.stream().clone();
    let ptx = KernelCache::new(dir.path())
        .ptx(module.name, module.source, "sm_90")
        .expect("compiles");
    let loaded = stream.context().load_module(ptx.ptx).expect("loads");
    let functions = names
        .iter()
        .map(|n| loaded.load_function(n).expect("a kernel of the module"))
        .collect();
    Some((stream, functions))
}

fn config(grid: (u32, u32, u32), block: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    }
}

#[test]
fn launches_beyond_cuda_limits_fail_naming_the_kernel_and_the_limit() {
    let Some((stream, f)) = interpreter(&ELEMENTWISE, &["rms_norm"]) else {
        return;
    };
    let (rows, dim) = (2i32, 64i32);
    let x: Vec<f32> = (0..rows * dim).map(|i| (i % 7) as f32 - 3.0).collect();
    let w: Vec<f32> = (0..dim).map(|i| 1.0 + i as f32 / 64.0).collect();
    let xd = stream.clone_htod(&x).expect("copy");
    let wd = stream.clone_htod(&w).expect("copy");
    let mut out = stream.alloc_zeros::<f32>(x.len()).expect("alloc");
    let (eps, offset) = (1e-6f32, 0.0f32);
    let launch = |cfg: LaunchConfig, out: &mut cudarc::driver::CudaSlice<f32>| {
        let mut b = stream.launch_builder(&f[0]);
        b.arg(&xd)
            .arg(&wd)
            .arg(out)
            .arg(&rows)
            .arg(&dim)
            .arg(&eps)
            .arg(&offset);
        // SAFETY: rms_norm's parameters in order and type; the buffers hold rows x dim.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| e.to_string())
    };

    // Within the limits: pagoda-kernels' answer.
    launch(config((rows as u32, 1, 1), 64, 0), &mut out).expect("a valid launch");
    let got = stream.clone_dtoh(&out).expect("copy back");
    let mut want = vec![0.0f32; x.len()];
    pagoda_kernels::ops::rms_norm(&x, &w, eps, offset, &mut want);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }

    for (cfg, expect) in [
        (config((1, 1, 1), 2048, 0), "exceeds 1024 threads"),
        (config((1, 70_000, 1), 64, 0), "exceeds the grid limits"),
        (config((1, 1, 1), 64, 64 * 1024), "dynamic shared memory"),
        (config((1, 1, 1), 48, 0), "warp of 16 threads"),
    ] {
        let e = launch(cfg, &mut out).expect_err(expect);
        assert!(e.contains("rms_norm") && e.contains(expect), "{e}");
    }

    // A host address where a device one belongs: refused, not dereferenced.
    let host = x.as_ptr() as u64;
    let mut b = stream.launch_builder(&f[0]);
    b.arg(&host)
        .arg(&wd)
        .arg(&mut out)
        .arg(&rows)
        .arg(&dim)
        .arg(&eps)
        .arg(&offset);
    // SAFETY: the interpreter checks pointer arguments before running anything.
    let e = unsafe { b.launch(config((1, 1, 1), 64, 0)) }
        .map(|_| ())
        .expect_err("a host pointer")
        .to_string();
    assert!(
        e.contains("ILLEGAL_ADDRESS") && e.contains("argument 0"),
        "{e}"
    );
}

#[test]
fn more_threads_than_launch_bounds_is_out_of_resources() {
    let Some((stream, f)) = interpreter(&ATTENTION, &["attn_decode_reduce"]) else {
        return;
    };
    let acc = stream.alloc_zeros::<f32>(64).expect("alloc");
    let ml = stream.alloc_zeros::<f32>(4).expect("alloc");
    let mut out = stream.alloc_zeros::<f32>(64).expect("alloc");
    let seqs = stream.clone_htod(&[0i32]).expect("copy");
    let first = stream.clone_htod(&[0i32]).expect("copy");
    let (n_heads, head_dim, n_splits) = (1i32, 32i32, 2i32);
    let mut b = stream.launch_builder(&f[0]);
    b.arg(&acc).arg(&ml).arg(&mut out).arg(&seqs).arg(&first);
    b.arg(&n_heads).arg(&head_dim).arg(&n_splits);
    // SAFETY: attn_decode_reduce's parameters in order and type; the launch is refused before
    // anything runs (256 threads against __launch_bounds__(128)).
    let e = unsafe { b.launch(config((1, 1, 1), 256, 0)) }
        .map(|_| ())
        .expect_err("over its launch bounds")
        .to_string();
    assert!(
        e.contains("LAUNCH_OUT_OF_RESOURCES") && e.contains("__launch_bounds__"),
        "{e}"
    );
}
