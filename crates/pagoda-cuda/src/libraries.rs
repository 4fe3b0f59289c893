//! Which of the CUDA libraries Pagoda loads at run time are present: the driver (`libcuda`),
//! NVRTC (compiles the kernels' CUDA C at first use) and cuBLAS (the large products).
//!
//! Invariant: finding a library only tries to open it; nothing is called in it, so this is
//! safe to run on any machine, any number of times.

/// The driver library (`libcuda`).
pub const DRIVER: &str = "driver";
/// The run-time compiler (`libnvrtc`).
pub const NVRTC: &str = "nvrtc";
/// The BLAS library (`libcublas`).
pub const CUBLAS: &str = "cublas";

/// Which libraries load on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Libraries {
    pub driver: bool,
    pub nvrtc: bool,
    pub cublas: bool,
}

impl Libraries {
    /// Tries to open each library (as cudarc would: the same names, the same search path).
    /// The CUDA interpreter's stand-ins count once loaded
    /// ([`crate::interpret::find_libraries`] loads it first when asked for).
    pub fn find() -> Self {
        // SAFETY: each `is_culib_present` only attempts `dlopen` on the library's candidate
        // names and drops the handle; no symbol is resolved or called. Opening a library
        // runs its initialisers, which is what any CUDA program does at start.
        unsafe {
            Libraries {
                driver: cudarc::driver::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
            }
        }
    }

    /// The libraries that did not load, by name ([`DRIVER`], [`NVRTC`], [`CUBLAS`]).
    pub fn missing(&self) -> Vec<&'static str> {
        [
            (self.driver, DRIVER),
            (self.nvrtc, NVRTC),
            (self.cublas, CUBLAS),
        ]
        .into_iter()
        .filter_map(|(found, name)| (!found).then_some(name))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_lists_exactly_the_libraries_not_found() {
        let l = Libraries {
            driver: false,
            nvrtc: true,
            cublas: false,
        };
        assert_eq!(l.missing(), vec![DRIVER, CUBLAS]);
        let all = Libraries {
            driver: true,
            nvrtc: true,
            cublas: true,
        };
        assert!(all.missing().is_empty());
    }

    #[test]
    fn finding_reports_what_loads_without_panicking() {
        // cudarc's own loaders panic on a missing library; finding must answer instead, and
        // under CI scripts/test.sh has put the NVRTC wheel's library on LD_LIBRARY_PATH.
        let found = Libraries::find();
        if std::env::var_os("CI").is_some() {
            assert!(found.nvrtc, "NVRTC must load under CI: {found:?}");
        }
        assert_eq!(found.missing().contains(&NVRTC), !found.nvrtc);
    }
}
