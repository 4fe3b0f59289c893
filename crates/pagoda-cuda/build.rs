//! Builds the CUDA interpreter (`interpret/`): pagoda-cuda's kernel sources compiled as host
//! C++ with the emulation header, and host implementations of the CUDA driver, NVRTC and
//! cuBLAS calls Pagoda makes, as three shared libraries in `$OUT_DIR/interpret`:
//! `libcuda.so` (everything; soname `libcuda.so`) and two empty `libnvrtc.so` /
//! `libcublas.so` whose sonames are those names and which need the first. `src/interpret.rs`
//! embeds them and loads them before cudarc opens the CUDA libraries by those names.
//!
//! Without a C++ compiler the crate still builds: the cfg `pagoda_cuda_interpret` is then
//! unset and asking for the interpreter says how to get one. `PAGODA_CUDA_INTERPRET_SANITIZE`
//! builds it with sanitizers: `address,undefined` (run with the ASan runtime preloaded) or
//! `thread` (each CUDA thread an OS thread, so ThreadSanitizer sees them).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel modules (kernels/mod.rs' MODULES), by name and file.
const MODULES: &[(&str, &str)] = &[
    ("elementwise", "src/kernels/elementwise.cu"),
    ("attention", "src/kernels/attention.cu"),
    ("quant", "src/kernels/quant.cu"),
];
const SOURCES: &[&str] = &["runtime", "driver", "nvrtc", "cublas", "kernels"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pagoda_cuda_interpret)");
    println!("cargo::rerun-if-changed=interpret");
    println!("cargo::rerun-if-changed=src/kernels");
    println!("cargo::rerun-if-env-changed=CXX");
    println!("cargo::rerun-if-env-changed=PAGODA_CUDA_INTERPRET_SANITIZE");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("interpret");
    match build(&out) {
        Ok(()) => println!("cargo::rustc-cfg=pagoda_cuda_interpret"),
        Err(e) => println!(
            "cargo::warning=the CUDA interpreter is not built ({e}); --device cuda-interpret \
             will say so. Install a C++17 compiler (g++ or clang++, or set CXX) to build it."
        ),
    }
}

/// FNV-1a, 64 bits (interpret/nvrtc.cpp computes the same over a source it is given).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn build(out: &Path) -> Result<(), String> {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os != "linux" || arch != "x86_64" {
        // The fibers switch in x86-64 assembly, and the libraries stand in for Linux sonames.
        return Err(format!(
            "it runs on x86-64 Linux, this target is {arch} {os}"
        ));
    }
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let mut hashes = Vec::new();
    for (name, file) in MODULES {
        let source = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        hashes.push(format!("{{\"{name}\", 0x{:016x}ull}}", fnv1a(&source)));
    }
    let mut flags: Vec<String> = ["-std=c++17", "-fPIC", "-fvisibility=hidden", "-pthread"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    flags.push("-Wno-unknown-pragmas".into());
    flags.push(format!("-DPAGODA_MODULE_HASHES={}", hashes.join(",")));
    match env::var("PAGODA_CUDA_INTERPRET_SANITIZE").ok().as_deref() {
        None | Some("") => flags.push("-O2".into()),
        Some("thread") => flags.extend(
            ["-O1", "-g", "-fsanitize=thread", "-DPAGODA_INTERP_THREADS"].map(String::from),
        ),
        Some(list) => flags.extend([
            "-O1".to_string(),
            "-g".to_string(),
            "-fno-omit-frame-pointer".to_string(),
            format!("-fsanitize={list}"),
            "-fno-sanitize-recover=all".to_string(),
        ]),
    }
    let mut objects = Vec::new();
    for source in SOURCES {
        let object = out.join(format!("{source}.o"));
        run(Command::new(&cxx)
            .args(&flags)
            .arg("-c")
            .arg(format!("interpret/{source}.cpp"))
            .arg("-o")
            .arg(&object))?;
        objects.push(object);
    }
    let sanitize: Vec<String> = flags
        .iter()
        .filter(|f| f.starts_with("-fsanitize="))
        .cloned()
        .collect();
    run(Command::new(&cxx)
        .args(["-shared", "-pthread", "-Wl,-soname,libcuda.so"])
        .args(&sanitize)
        .args(&objects)
        .arg("-o")
        .arg(out.join("libcuda.so")))?;
    for lib in ["libnvrtc.so", "libcublas.so"] {
        run(Command::new(&cxx)
            .args(["-x", "c", "-shared", "-fPIC"])
            .arg(format!("-Wl,-soname,{lib}"))
            .arg("interpret/stub.c")
            .args(["-x", "none", "-Wl,--no-as-needed"])
            .arg(out.join("libcuda.so"))
            .arg("-o")
            .arg(out.join(lib)))?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let output = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .take(20)
                .collect::<Vec<_>>()
                .join(" | ")
        ))
    }
}
