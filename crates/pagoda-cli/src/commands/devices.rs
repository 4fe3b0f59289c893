//! `pagoda devices`: what Pagoda can run on here — the CPU (the SIMD path its kernels take
//! and the threads they use) and each NVIDIA GPU the driver reports (name, memory, compute
//! capability), or, when none is usable, which CUDA library is missing and how to get it;
//! and the version and file of each CUDA library that loads (driver, NVRTC, cuBLAS), with a
//! warning when NVRTC is newer than the driver (its kernels would not load).
//!
//! Invariant: the command never fails for want of a GPU (a CPU-only machine is a normal
//! answer); it exits 1 only when a GPU's libraries load but the driver errors.

use crate::cli::DevicesArgs;
use pagoda_cuda::{CudaError, Gpu, Libraries, LibraryVersions, LoadedLibrary};
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Report {
    cpu: Cpu,
    cuda_libraries: Libraries,
    /// Version and file of each library that loads.
    cuda_library_versions: LibraryVersions,
    /// Why the libraries found will not work together (NVRTC newer than the driver).
    cuda_library_warning: Option<String>,
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
    let found = pagoda_cuda::interpret::find_libraries().unwrap_or_else(|_| Libraries::find());
    let versions = LibraryVersions::probe(found);
    let report = Report {
        cpu,
        cuda_libraries: found,
        // The interpreter's driver loads any PTX (it reports CUDA 12.8 whatever compiled it).
        cuda_library_warning: versions
            .mismatch()
            .filter(|_| !pagoda_cuda::interpret::installed()),
        cuda_library_versions: versions,
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
    for line in library_lines(&report.cuda_library_versions) {
        println!("{line}");
    }
    if let Some(warning) = &report.cuda_library_warning {
        println!("warning  {warning}");
    }
    Ok(())
}

/// One line per CUDA library: `driver   CUDA 13.0  /usr/lib/.../libcuda.so.580.82.07`, or
/// `nvrtc    not found`.
fn library_lines(v: &LibraryVersions) -> Vec<String> {
    let line = |label: &str, prefix: &str, lib: &Option<LoadedLibrary>| match lib {
        None => format!("{label:<8} not found"),
        Some(l) => {
            let version = format!("{prefix}{}", l.version);
            match &l.path {
                Some(path) => format!("{label:<8} {version:<10} {path}"),
                None => format!("{label:<8} {version}"),
            }
        }
    };
    vec![
        line("driver", "CUDA ", &v.driver),
        line("nvrtc", "", &v.nvrtc),
        line("cublas", "", &v.cublas),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LibraryVersions {
        LibraryVersions {
            driver: Some(LoadedLibrary {
                version: "13.0".into(),
                path: Some("/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07".into()),
            }),
            nvrtc: Some(LoadedLibrary {
                version: "12.9".into(),
                path: None,
            }),
            cublas: None,
        }
    }

    #[test]
    fn library_lines_name_version_and_file_or_say_not_found() {
        assert_eq!(
            library_lines(&sample()),
            vec![
                "driver   CUDA 13.0  /usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07",
                "nvrtc    12.9",
                "cublas   not found",
            ]
        );
    }

    #[test]
    fn the_json_report_carries_versions_files_and_the_warning() {
        let report = Report {
            cpu: Cpu {
                simd: "avx2",
                threads: 4,
            },
            cuda_libraries: Libraries {
                driver: true,
                nvrtc: true,
                cublas: false,
            },
            cuda_library_versions: sample(),
            cuda_library_warning: None,
            gpus: Vec::new(),
            gpu_unavailable: Some("no GPU".into()),
        };
        let json = serde_json::to_value(&report).expect("serializes");
        let versions = &json["cuda_library_versions"];
        assert_eq!(versions["driver"]["version"], "13.0");
        assert_eq!(
            versions["driver"]["path"],
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07"
        );
        assert_eq!(versions["nvrtc"]["version"], "12.9");
        assert!(versions["nvrtc"]["path"].is_null());
        assert!(versions["cublas"].is_null());
        assert!(json["cuda_library_warning"].is_null());
        assert_eq!(json["cuda_libraries"]["cublas"], false);
    }
}
