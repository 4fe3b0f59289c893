//! Which of the CUDA libraries Pagoda loads at run time are present: the driver (`libcuda`),
//! NVRTC (compiles the kernels' CUDA C at first use) and cuBLAS (the large products); and,
//! for those that load, their versions and the files they were loaded from
//! ([`LibraryVersions`], shown by `pagoda devices`).
//!
//! Invariants: finding a library ([`Libraries::find`]) only tries to open it; nothing is
//! called in it, so this is safe to run on any machine, any number of times. Probing
//! versions calls only each library's version query (no context, no handle, no GPU work),
//! and only in the libraries `find` saw load.

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

/// A CUDA library that loaded: its version and the file the process mapped it from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoadedLibrary {
    /// `major.minor` (cuBLAS: `major.minor.patch`); for the driver, the newest CUDA version
    /// it supports (`cuDriverGetVersion`). The CUDA interpreter's NVRTC and cuBLAS are `0.0`.
    pub version: String,
    /// The file, as `/proc/self/maps` names it (symbolic links resolved); `None` where that
    /// is not available.
    pub path: Option<String>,
}

/// The versions of the CUDA libraries that load (`None`: missing, or its version query
/// failed).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LibraryVersions {
    pub driver: Option<LoadedLibrary>,
    pub nvrtc: Option<LoadedLibrary>,
    pub cublas: Option<LoadedLibrary>,
}

impl LibraryVersions {
    /// Asks each library that `found` saw load for its version, and where it was loaded
    /// from. `found` comes from [`crate::interpret::find_libraries`] (the interpreter's
    /// stand-ins when it is asked for) or [`Libraries::find`]: a library marked found that
    /// does not load makes cudarc panic.
    pub fn probe(found: Libraries) -> Self {
        // The versions first: asking loads each library through cudarc, which keeps it
        // mapped (finding one only opened and closed it), so the map read after shows it.
        let driver = found.driver.then(driver_version).flatten();
        let nvrtc = found
            .nvrtc
            .then(|| nvrtc_version().ok())
            .flatten()
            .map(|(major, minor)| format!("{major}.{minor}"));
        let cublas = found.cublas.then(cublas_version).flatten();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let loaded = |lib: &str, version: Option<String>| {
            version.map(|version| LoadedLibrary {
                version,
                path: mapped_path(&maps, lib),
            })
        };
        LibraryVersions {
            driver: loaded("cuda", driver),
            nvrtc: loaded("nvrtc", nvrtc),
            cublas: loaded("cublas", cublas),
        }
    }

    /// A warning when NVRTC is newer than the CUDA version the driver supports: the PTX it
    /// writes then fails to load (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) and the fix is an
    /// older NVRTC first on the library path, or a newer driver.
    pub fn mismatch(&self) -> Option<String> {
        let (driver, nvrtc) = (self.driver.as_ref()?, self.nvrtc.as_ref()?);
        let (d, n) = (major_minor(&driver.version)?, major_minor(&nvrtc.version)?);
        (n > d).then(|| {
            format!(
                "NVRTC {} is newer than CUDA {}, the newest the driver supports: the kernels \
                 it compiles will not load; put an NVRTC of CUDA {} or older first on \
                 LD_LIBRARY_PATH, or update the driver",
                nvrtc.version, driver.version, driver.version
            )
        })
    }
}

/// NVRTC's `(major, minor)`, or its status when the call fails. The caller has seen NVRTC
/// load (cudarc panics otherwise); `kernels::nvrtc_version` is the same as a `CudaError`.
pub(crate) fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC loads (checked by the caller); nvrtcVersion writes two ints through
    // pointers to live locals.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("{status:?}"));
    }
    Ok((major, minor))
}

/// `"12.8"` or `"12.8.4"` → `(12, 8)`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The newest CUDA version the driver supports, e.g. `13.0` (from 13000).
fn driver_version() -> Option<String> {
    let mut v = 0;
    // SAFETY: the driver loads (checked by the caller); cuDriverGetVersion needs no cuInit
    // and writes one int through a pointer to a live local.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
        .then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// cuBLAS's `major.minor.patch`, through `cublasGetProperty` (no handle needed).
fn cublas_version() -> Option<String> {
    use cudarc::cublas::sys::{cublasGetProperty, cublasStatus_t, libraryPropertyType};
    let mut parts = [0; 3];
    let kinds = [
        libraryPropertyType::MAJOR_VERSION,
        libraryPropertyType::MINOR_VERSION,
        libraryPropertyType::PATCH_LEVEL,
    ];
    for (part, kind) in parts.iter_mut().zip(kinds) {
        // SAFETY: cuBLAS loads (checked by the caller); cublasGetProperty writes one int
        // through a pointer to a live local.
        let status = unsafe { cublasGetProperty(kind, part) };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return None;
        }
    }
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

/// The path of the first mapping in `maps` (the text of `/proc/self/maps`) whose file is
/// `lib{name}.so` or `lib{name}.so.*` (so `cublas` does not match `libcublasLt.so.13`).
fn mapped_path(maps: &str, name: &str) -> Option<String> {
    let stem = format!("lib{name}.so");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            let file = path.rsplit('/').next().unwrap_or(path);
            file == stem || file.strip_prefix(&stem).is_some_and(|r| r.starts_with('.'))
        })
        .map(str::to_string)
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

    #[test]
    fn the_mapped_file_is_the_library_itself_not_a_namesake() {
        let maps = "\
7f00-7f10 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libcudart.so.12.8.90
7f10-7f20 r-xp 00000000 08:01 2 /opt/cu13/lib/libcublasLt.so.13.0.2
7f20-7f30 r-xp 00000000 08:01 3 /opt/cu13/lib/libcublas.so.13.0.2
7f30-7f40 r-xp 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07
7f40-7f50 r-xp 00000000 08:01 5 /home/u/.cache/pagoda/cuda-interpret/ab/libnvrtc.so
7f50-7f60 r-xp 00000000 08:01 6 /opt/cu13/lib/libnvrtc-builtins.so.13.0
7f60-7f70 rw-p 00000000 00:00 0
";
        assert_eq!(
            mapped_path(maps, "cublas").as_deref(),
            Some("/opt/cu13/lib/libcublas.so.13.0.2")
        );
        assert_eq!(
            mapped_path(maps, "cuda").as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07")
        );
        assert_eq!(
            mapped_path(maps, "nvrtc").as_deref(),
            Some("/home/u/.cache/pagoda/cuda-interpret/ab/libnvrtc.so")
        );
        assert_eq!(mapped_path(maps, "cufft"), None);
    }

    #[test]
    fn an_nvrtc_newer_than_the_driver_is_named() {
        let lib = |v: &str| {
            Some(LoadedLibrary {
                version: v.into(),
                path: None,
            })
        };
        let versions = |driver: &str, nvrtc: &str| LibraryVersions {
            driver: lib(driver),
            nvrtc: lib(nvrtc),
            cublas: None,
        };
        let warning = versions("12.8", "13.0").mismatch().expect("13.0 > 12.8");
        assert!(
            warning.contains("NVRTC 13.0") && warning.contains("CUDA 12.8"),
            "{warning}"
        );
        assert!(versions("12.8", "12.9").mismatch().is_some());
        assert_eq!(versions("13.0", "12.9").mismatch(), None);
        assert_eq!(versions("13.0", "13.0").mismatch(), None);
        assert_eq!(
            versions("12.8", "0.0").mismatch(),
            None,
            "the interpreter's NVRTC"
        );
        assert_eq!(LibraryVersions::default().mismatch(), None);
    }

    #[test]
    fn probing_answers_for_exactly_the_libraries_that_load() {
        let found = crate::interpret::find_libraries().unwrap_or_else(|_| Libraries::find());
        let versions = LibraryVersions::probe(found);
        assert_eq!(versions.driver.is_some(), found.driver);
        assert_eq!(versions.nvrtc.is_some(), found.nvrtc);
        assert_eq!(versions.cublas.is_some(), found.cublas);
        if let Some(nvrtc) = &versions.nvrtc {
            assert!(major_minor(&nvrtc.version).is_some(), "{nvrtc:?}");
            if cfg!(target_os = "linux") {
                let path = nvrtc.path.as_deref().expect("mapped");
                assert!(path.contains("libnvrtc.so"), "{path}");
            }
        }
    }
}
