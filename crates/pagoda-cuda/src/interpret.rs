//! The CUDA interpreter: Pagoda's CUDA path run on the CPU, for machines (and CI) without a
//! GPU, as Triton's `TRITON_INTERPRET=1` or Numba's CUDA simulator run theirs.
//!
//! `build.rs` compiles `interpret/` — the kernel sources of [`crate::kernels`] unchanged
//! through a small CUDA emulation header, and host implementations of the driver, NVRTC and
//! cuBLAS calls Pagoda makes — into three shared libraries embedded here. [`install`] writes
//! them to the cache folder and loads them under the names cudarc opens (`libcuda.so`,
//! `libnvrtc.so`, `libcublas.so`), so everything above — [`crate::GpuContext`], the typed
//! launches with their argument checks, cuBLAS GEMMs, the model's CUDA backend — runs as it
//! would on a GPU, against one device named "Pagoda CUDA interpreter".
//!
//! It is chosen like a device: `--device cuda-interpret`, or `PAGODA_CUDA_INTERPRET=1` for
//! `cuda` (tests and scripts); `auto` never picks it ([`crate::Gpu::interpreted`]). A real
//! NVRTC compiles the kernels when one loads (so its PTX is checked too);
//! `PAGODA_CUDA_INTERPRET_NVRTC=builtin` uses the interpreter's own.
//!
//! Invariants: the interpreter is loaded before cudarc opens any CUDA library in the process
//! (after that cudarc keeps what it opened, so [`install`] refuses instead); loading is
//! idempotent; what a kernel launch breaks (block or grid limits, `__launch_bounds__`,
//! shared memory, a pointer argument outside device memory, a barrier not every thread
//! reaches) fails the launch with the driver error a GPU would give and a message naming the
//! kernel. Speed is not a goal: a CUDA thread is a fiber, blocks run one after another.

use crate::error::CudaError;
use crate::libraries::Libraries;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The environment variable that makes `cuda` mean the interpreter (`1`).
pub const ENV: &str = "PAGODA_CUDA_INTERPRET";

/// The device name the interpreter reports.
pub const DEVICE_NAME: &str = "Pagoda CUDA interpreter (host CPU)";

/// The libraries, in load order (the first is the one the others need).
#[cfg(pagoda_cuda_interpret)]
const LIBRARIES: [(&str, &[u8]); 3] = [
    (
        "libcuda.so",
        include_bytes!(concat!(env!("OUT_DIR"), "/interpret/libcuda.so")),
    ),
    (
        "libnvrtc.so",
        include_bytes!(concat!(env!("OUT_DIR"), "/interpret/libnvrtc.so")),
    ),
    (
        "libcublas.so",
        include_bytes!(concat!(env!("OUT_DIR"), "/interpret/libcublas.so")),
    ),
];

static INSTALLED: OnceLock<Result<PathBuf, CudaError>> = OnceLock::new();
/// Whether the interpreter's own NVRTC stands in for a real one (see `load`).
static BUILTIN_NVRTC: AtomicBool = AtomicBool::new(false);
/// Set once this process has used the real CUDA libraries through cudarc.
static REAL_LIBRARIES_USED: AtomicBool = AtomicBool::new(false);

/// Whether `PAGODA_CUDA_INTERPRET=1` asks for the interpreter.
pub fn requested() -> bool {
    std::env::var(ENV).is_ok_and(|v| v == "1")
}

/// Whether this build has the interpreter (a C++ compiler was found when it was built).
pub fn built() -> bool {
    cfg!(pagoda_cuda_interpret)
}

/// Whether the interpreter is loaded in this process.
pub fn installed() -> bool {
    matches!(INSTALLED.get(), Some(Ok(_)))
}

/// Loads the interpreter when [`requested`]; the CUDA calls that follow in this process then
/// reach it. A no-op otherwise.
pub fn install_if_requested() -> Result<(), CudaError> {
    if requested() || installed() {
        install()
    } else {
        Ok(())
    }
}

/// [`Libraries::find`] as the CUDA calls of this crate see it: with the interpreter loaded
/// first when asked for (its stand-ins are then what is found). Real libraries found while
/// the interpreter is not loaded are noted (cudarc may open them next): [`install`] refuses
/// afterwards.
pub fn find_libraries() -> Result<Libraries, CudaError> {
    install_if_requested()?;
    let found = Libraries::find();
    if !installed() && (found.driver || found.nvrtc || found.cublas) {
        REAL_LIBRARIES_USED.store(true, Ordering::Relaxed);
    }
    Ok(found)
}

/// For tests that need a GPU: without one they print `skipped: no GPU (reason)` and pass,
/// except under CI (`CI` set), where the GPU tests run in the interpreter
/// (`PAGODA_CUDA_INTERPRET=1`, scripts/test.sh) and a skip is a failure.
pub fn no_gpu_for_test(reason: impl std::fmt::Display) {
    assert!(
        std::env::var_os("CI").is_none(),
        "no GPU under CI ({reason}): the GPU tests run in the CUDA interpreter there; set \
         {ENV}=1 (scripts/test.sh does)"
    );
    eprintln!("skipped: no GPU ({reason})");
}

/// Loads the interpreter's libraries (once per process; later calls answer the first
/// call's result). Refused after the real CUDA libraries were used in this process.
pub fn install() -> Result<(), CudaError> {
    INSTALLED
        .get_or_init(|| {
            if REAL_LIBRARIES_USED.load(Ordering::Relaxed) {
                return Err(CudaError::Interpreter(
                    "the real CUDA libraries were already used in this process; choose the \
                     interpreter first (--device cuda-interpret, or PAGODA_CUDA_INTERPRET=1 \
                     in the environment)"
                        .into(),
                ));
            }
            load()
        })
        .clone()
        .map(|_| ())
}

/// Whether kernels are "compiled" by the interpreter's own NVRTC (no real NVRTC loads, or
/// `PAGODA_CUDA_INTERPRET_NVRTC=builtin`): it accepts only Pagoda's kernel sources.
pub fn builtin_nvrtc() -> bool {
    installed() && BUILTIN_NVRTC.load(Ordering::Relaxed)
}

/// Where the libraries were written (`None` when not installed).
pub fn library_dir() -> Option<PathBuf> {
    INSTALLED.get().and_then(|r| r.as_ref().ok().cloned())
}

#[cfg(not(pagoda_cuda_interpret))]
fn load() -> Result<PathBuf, CudaError> {
    Err(CudaError::Interpreter(
        "this build of Pagoda has no CUDA interpreter: no C++ compiler was found when it \
         was built; install g++ (or set CXX) and rebuild"
            .into(),
    ))
}

#[cfg(pagoda_cuda_interpret)]
fn load() -> Result<PathBuf, CudaError> {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    for (name, bytes) in LIBRARIES {
        digest.update(name.as_bytes());
        digest.update(bytes);
    }
    let mut hash = hex::encode(digest.finalize());
    hash.truncate(16);
    let dir = cache_root().join(hash);
    for (name, bytes) in LIBRARIES {
        write_once(&dir.join(name), bytes)?;
    }
    // A real NVRTC, when one loads, compiles the kernels (real PTX, whose `.entry` lines the
    // interpreter's driver reads): the kernels are then checked against the real compiler
    // too, and the kernel cache holds only real PTX. `PAGODA_CUDA_INTERPRET_NVRTC=builtin`
    // (or no NVRTC on the machine) uses the interpreter's own.
    let builtin = std::env::var("PAGODA_CUDA_INTERPRET_NVRTC").is_ok_and(|v| v == "builtin")
        // SAFETY: only attempts dlopen of NVRTC's candidate names (as Libraries::find).
        || !unsafe { cudarc::nvrtc::sys::is_culib_present() };
    BUILTIN_NVRTC.store(builtin, Ordering::Relaxed);
    for (name, _) in LIBRARIES {
        if name == "libnvrtc.so" && !builtin {
            continue;
        }
        let path = dir.join(name);
        // SAFETY: these are the interpreter's own libraries, built with this crate; opening
        // one runs only C++ static initialisers (the kernel registry). RTLD_GLOBAL makes the
        // first one's soname (libcuda.so) satisfy the others' DT_NEEDED and cudarc's later
        // dlopen of that name. The handles are kept for the life of the process.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        }
        .map_err(|e| CudaError::Interpreter(format!("loading {}: {e}", path.display())))?;
        std::mem::forget(lib);
    }
    Ok(dir)
}

/// The user's cache folder's `pagoda/cuda-interpret` (the temporary folder without one).
#[cfg(pagoda_cuda_interpret)]
fn cache_root() -> PathBuf {
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("pagoda")
        .join("cuda-interpret")
}

/// Writes `bytes` to `path` unless a file of that content is there (content-addressed
/// folder: a file of the right size is the right file), through a temporary name.
#[cfg(pagoda_cuda_interpret)]
fn write_once(path: &std::path::Path, bytes: &[u8]) -> Result<(), CudaError> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(());
    }
    let fail = |e: std::io::Error| CudaError::Interpreter(format!("{}: {e}", path.display()));
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_ci_the_interpreter_is_built() {
        if std::env::var_os("CI").is_some() {
            assert!(
                built(),
                "CI builds the CUDA interpreter (a C++ compiler is installed)"
            );
        }
    }
}
