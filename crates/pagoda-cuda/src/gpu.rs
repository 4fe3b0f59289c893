//! The GPUs the driver reports: ordinal, name, memory and compute capability.
//!
//! Invariant: [`list_gpus`] calls into the driver only after [`Libraries::find`](crate::libraries::Libraries::find) has seen
//! every library Pagoda needs load, so it answers [`CudaError::MissingLibraries`] (never a
//! panic) on a machine without them.

use crate::error::CudaError;
use cudarc::driver::CudaContext;

/// One usable GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Gpu {
    /// The driver's device number (`cuda:N`).
    pub ordinal: usize,
    pub name: String,
    pub memory_bytes: u64,
    /// `(major, minor)`, e.g. `(9, 0)` for an H100/H200.
    pub compute_capability: (i32, i32),
    /// The CUDA interpreter ([`crate::interpret`]) rather than a GPU: `--device auto` never
    /// picks it.
    pub interpreted: bool,
}

/// The GPUs Pagoda could use, or why none can be.
pub fn list_gpus() -> Result<Vec<Gpu>, CudaError> {
    let missing = crate::interpret::find_libraries()?.missing();
    if !missing.is_empty() {
        return Err(CudaError::MissingLibraries(missing));
    }
    let driver = |call: &'static str| {
        move |e: cudarc::driver::DriverError| CudaError::Driver {
            call,
            message: e.to_string(),
        }
    };
    let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
    if count <= 0 {
        return Err(CudaError::NoDevice);
    }
    (0..count as usize)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
            Ok(Gpu {
                ordinal,
                name: ctx.name().map_err(driver("cuDeviceGetName"))?,
                memory_bytes: ctx.total_mem().map_err(driver("cuDeviceTotalMem"))? as u64,
                compute_capability: ctx
                    .compute_capability()
                    .map_err(driver("cuDeviceGetAttribute"))?,
                interpreted: crate::interpret::installed(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libraries::Libraries;

    #[test]
    fn without_the_libraries_the_answer_names_them_and_does_not_panic() {
        let gpus = list_gpus();
        // As list_gpus saw them: the CUDA interpreter's stand-ins when it is asked for.
        let found = crate::interpret::find_libraries().unwrap_or_else(|_| Libraries::find());
        match gpus {
            Err(CudaError::MissingLibraries(missing)) => assert_eq!(missing, found.missing()),
            Ok(gpus) => {
                assert!(found.missing().is_empty());
                assert!(!gpus.is_empty());
                assert!(gpus
                    .iter()
                    .all(|g| g.memory_bytes > 0 && !g.name.is_empty()));
            }
            Err(other) => assert!(found.missing().is_empty(), "{other}"),
        }
    }
}
