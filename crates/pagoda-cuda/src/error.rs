//! [`CudaError`]: why a GPU cannot be used, in words that say what to install or check.

/// Why Pagoda cannot use an NVIDIA GPU here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// A library Pagoda loads at run time was not found.
    #[error("{}", missing_message(.0))]
    MissingLibraries(Vec<&'static str>),
    /// The driver loaded but reports no GPU.
    #[error("the NVIDIA driver is installed but reports no GPU (check `nvidia-smi`, and CUDA_VISIBLE_DEVICES if it is set)")]
    NoDevice,
    /// NVRTC refused a kernel's source.
    #[error("compiling CUDA kernel `{kernel}` failed: {log}")]
    Compile { kernel: String, log: String },
    /// The kernel cache could not be written.
    #[error(
        "writing the kernel cache {path}: {message} (set PAGODA_KERNEL_CACHE to a writable folder)"
    )]
    Cache {
        path: std::path::PathBuf,
        message: String,
    },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    /// There is no GPU with this ordinal.
    #[error("there is no GPU cuda:{ordinal} (the driver reports {count}; see `pagoda devices`)")]
    NoSuchDevice { ordinal: usize, count: usize },
    /// The GPU cannot run Pagoda's kernels.
    #[error("GPU {name} (compute capability {}.{}) is not supported: {reason}", .capability.0, .capability.1)]
    Unsupported {
        name: String,
        capability: (i32, i32),
        reason: &'static str,
    },
    /// A kernel or GEMM was called with sizes, buffers or parameters that do not fit (a caller
    /// bug caught before anything is launched).
    #[error("CUDA kernel `{kernel}`: {message}")]
    Shape {
        kernel: &'static str,
        message: String,
    },
    /// Launching a kernel failed (or an earlier asynchronous error surfaced at this launch).
    #[error("launching CUDA kernel `{kernel}` failed: {message} (an error from an earlier launch may surface here; synchronize after each launch, or run under compute-sanitizer, to find the first)")]
    Launch {
        kernel: &'static str,
        message: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {message}")]
    Blas { call: &'static str, message: String },
    /// The CUDA interpreter (`--device cuda-interpret`, `PAGODA_CUDA_INTERPRET=1`) could not
    /// be used; the message says why and what to do.
    #[error("the CUDA interpreter cannot be used: {0}")]
    Interpreter(String),
}

/// What to install for each missing library.
fn missing_message(missing: &[&'static str]) -> String {
    let hints: Vec<String> = missing
        .iter()
        .map(|lib| match *lib {
            crate::libraries::DRIVER => "the NVIDIA driver (libcuda.so: install the GPU driver)".to_string(),
            crate::libraries::NVRTC => "NVRTC (libnvrtc.so: the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` with its lib folder on LD_LIBRARY_PATH)".to_string(),
            crate::libraries::CUBLAS => "cuBLAS (libcublas.so and libcublasLt.so: the CUDA toolkit, or `pip install nvidia-cublas-cu12` with its lib folder on LD_LIBRARY_PATH)".to_string(),
            other => other.to_string(),
        })
        .collect();
    format!("no usable NVIDIA GPU: missing {}", hints.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libraries::{CUBLAS, DRIVER, NVRTC};

    #[test]
    fn a_missing_library_is_named_with_what_to_install() {
        let e = CudaError::MissingLibraries(vec![DRIVER, CUBLAS]).to_string();
        assert!(
            e.contains("libcuda.so") && e.contains("install the GPU driver"),
            "{e}"
        );
        assert!(
            e.contains("libcublas.so") && e.contains("nvidia-cublas-cu12"),
            "{e}"
        );
        assert!(!e.contains("NVRTC"), "{e}");
        let e = CudaError::MissingLibraries(vec![NVRTC]).to_string();
        assert!(e.contains("nvidia-cuda-nvrtc-cu12"), "{e}");
    }
}
