//! Writes the PTX of every kernel module ([`pagoda_cuda::kernels::MODULES`]) for the given
//! architectures, compiled by whichever NVRTC loads (the same [`KernelCache::ptx`] path, so
//! the same options, as a GPU run), for `scripts/cuda/ptxas_gate.py` to hand to `ptxas -v`.
//!
//! Usage: `write_ptx OUT_DIR ARCH...` (e.g. `sm_80 sm_90`). Writes `OUT_DIR/MODULE-ARCH.ptx`
//! and prints `nvrtc MAJOR.MINOR` first, so the caller can check which NVRTC compiled them.
//! A fresh cache folder under OUT_DIR forces a compile every time.
//!
//! Not for the CUDA interpreter (its "PTX" is a placeholder): refuses when
//! `PAGODA_CUDA_INTERPRET=1`.

use pagoda_cuda::kernels::{nvrtc_version, MODULES};
use pagoda_cuda::{KernelCache, Libraries};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("write_ptx: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: write_ptx OUT_DIR ARCH...")?);
    let archs: Vec<String> = args.collect();
    if archs.is_empty() {
        return Err("usage: write_ptx OUT_DIR ARCH...".into());
    }
    if pagoda_cuda::interpret::requested() {
        return Err("unset PAGODA_CUDA_INTERPRET: the interpreter compiles no PTX".into());
    }
    if !Libraries::find().nvrtc {
        return Err("NVRTC does not load (put its lib folder on LD_LIBRARY_PATH)".into());
    }
    let (major, minor) = nvrtc_version().map_err(|e| e.to_string())?;
    println!("nvrtc {major}.{minor}");
    let cache = KernelCache::new(out.join(format!("cache-nvrtc{major}.{minor}")));
    for arch in &archs {
        // KernelCache::ptx takes the architecture as 'static (it comes from kernels::arch_for).
        let arch: &'static str = Box::leak(arch.clone().into_boxed_str());
        for module in MODULES {
            let compiled = cache
                .ptx(module.name, module.source, arch)
                .map_err(|e| format!("{} for {arch}: {e}", module.name))?;
            let path = out.join(format!("{}-{arch}.ptx", module.name));
            std::fs::write(&path, compiled.ptx.to_src())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            println!("{}", path.display());
        }
    }
    Ok(())
}
