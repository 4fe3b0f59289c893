//! `pagoda devices`: what Pagoda can run on here — the CPU (the SIMD path its kernels take
//! and the threads they use) and each NVIDIA GPU the driver reports (name, memory, compute
//! capability), or, when none is usable, which CUDA library is missing and how to get it.
//!
//! Invariant: the command never fails for want of a GPU (a CPU-only machine is a normal
//! answer); it exits 1 only when a GPU's libraries load but the driver errors.

use crate::cli::DevicesArgs;
use pagoda_cuda::{CudaError, Gpu, Libraries};
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Report {
    cpu: Cpu,
    cuda_libraries: Libraries,
    gpus: Vec<Gpu>,
    /// Why no GPU can be used, when none can.
    gpu_unavailable: Option<String>,
}

#[derive(Debug, Serialize)]
struct Cpu {
    simd: &'static str,
    threads: usize,
}

/// Runs `pagoda devices`.
pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    let cpu = Cpu {
        simd: pagoda_kernels::cpu::best_isa().name(),
        threads: rayon::current_num_threads(),
    };
    let (gpus, unavailable) = match pagoda_cuda::list_gpus() {
        Ok(gpus) => (gpus, None),
        Err(e @ (CudaError::MissingLibraries(_) | CudaError::NoDevice)) => {
            (Vec::new(), Some(e.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    let report = Report {
        cpu,
        cuda_libraries: pagoda_cuda::interpret::find_libraries()
            .unwrap_or_else(|_| Libraries::find()),
        gpus,
        gpu_unavailable: unavailable,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "cpu      {} kernels, {} threads",
        report.cpu.simd, report.cpu.threads
    );
    for g in &report.gpus {
        println!(
            "cuda:{}   {}, {:.1} GiB, compute capability {}.{}",
            g.ordinal,
            g.name,
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.compute_capability.0,
            g.compute_capability.1
        );
    }
    if let Some(why) = &report.gpu_unavailable {
        println!("cuda     {why}");
    }
    Ok(())
}
