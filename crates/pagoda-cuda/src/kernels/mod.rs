//! Kernels written in CUDA C, compiled by NVRTC at first use for the GPU's architecture and
//! kept on disk, so a later start loads the PTX instead of compiling again.
//!
//! Owns the kernel sources ([`MODULES`]: `elementwise.cu`, the row and elementwise kernels;
//! `attention.cu`, paged attention; `quant.cu`, quantized weight matrices) with the entry
//! points each must define, and the cache. What the kernels compute and how they are
//! launched is `ops.rs`, `attention.rs` and `quant.rs`.
//!
//! Invariants: a cached file is named by the kernel's name, the architecture and a SHA-256
//! of the source together with the architecture, the compile options and the NVRTC version,
//! so an edited kernel, another GPU generation, other options or another NVRTC (whose PTX
//! an older driver cannot load; the CUDA interpreter's is version 0.0) never load a stale
//! file; a file is
//! written under a temporary name and renamed into place, so a crash or two processes
//! compiling at once never leave a torn one. A compile error carries the kernel's name and
//! NVRTC's log.

use crate::error::CudaError;
use crate::libraries::NVRTC;
use cudarc::nvrtc::{CompileOptions, Ptx};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The NVRTC architecture name of a compute capability Pagoda compiles for, e.g.
/// `(9, 0)` → `sm_90` (H100/H200); `None` for one it does not know.
pub fn arch_for(compute_capability: (i32, i32)) -> Option<&'static str> {
    Some(match compute_capability {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => return None,
    })
}

/// One kernel module: its name (the cache file's prefix), CUDA C source and entry points.
#[derive(Debug, Clone, Copy)]
pub struct KernelModule {
    pub name: &'static str,
    pub source: &'static str,
    pub entries: &'static [&'static str],
}

/// The row and elementwise kernels (`ops.rs` launches them).
pub const ELEMENTWISE: KernelModule = KernelModule {
    name: "elementwise",
    source: include_str!("elementwise.cu"),
    entries: &[
        "embed_bf16",
        "rms_norm",
        "add_f32",
        "add_bias",
        "silu_mul",
        "gelu_tanh_mul",
        "to_bf16",
        "softcap",
        "gather_rows",
        "rope",
        "kv_write",
        "kv_write_fp8",
        "scale_f32",
        "copy_columns",
        "scatter_add_rows",
        "swiglu_oai_mul",
    ],
};

/// Paged attention (`attention.rs` launches it).
pub const ATTENTION: KernelModule = KernelModule {
    name: "attention",
    source: include_str!("attention.cu"),
    entries: &[
        "attn_decode",
        "attn_decode_reduce",
        "attn_prefill",
        "attn_decode_fp8",
        "attn_prefill_fp8",
    ],
};

/// The entry points of `quant.cu`: per format (in `QuantFormat::ALL` order) its GEMV,
/// dequantize and embedding kernels, then the 8-bit formats' int8 GEMV and its activation
/// quantizer.
macro_rules! quant_entries {
    ($($f:literal),+) => {
        &[
            $(concat!("qgemv_", $f), concat!("qdequant_", $f), concat!("qembed_", $f),)+
            "quantize_q8_act",
            "qgemv8_q8_0",
            "qgemv8_int8",
        ]
    };
}

/// Quantized weight matrices (`quant.rs` launches them).
pub const QUANT: KernelModule = KernelModule {
    name: "quant",
    source: include_str!("quant.cu"),
    entries: quant_entries!(
        "q8_0",
        "q4_0",
        "q4_1",
        "q4_k",
        "q5_k",
        "q6_k",
        "int8",
        "int4_g64",
        "int4_g64_sym",
        "int4_g128",
        "int4_g128_sym",
        "nf4",
        "nf4_dq",
        "mxfp4"
    ),
};

/// Every kernel module Pagoda loads.
pub const MODULES: &[KernelModule] = &[ELEMENTWISE, ATTENTION, QUANT];

/// Options every kernel is compiled with (part of the cache key).
const OPTIONS: &[&str] = &["--std=c++17"];

/// A compiled kernel module.
#[derive(Debug)]
pub struct Compiled {
    pub ptx: Ptx,
    /// The cached file it was read from or written to.
    pub path: PathBuf,
    /// Whether it came from the cache (no compile this time).
    pub from_cache: bool,
}

/// The on-disk cache of compiled kernels.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// A cache in `dir` (created when the first kernel is written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// `$PAGODA_KERNEL_CACHE`, else the user's cache folder's `pagoda/kernels`.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("PAGODA_KERNEL_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => dirs::cache_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("pagoda")
                .join("kernels"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The PTX of kernel module `name` (`source` in CUDA C) for `arch`: from the cache, or
    /// compiled by NVRTC and cached.
    pub fn ptx(&self, name: &str, source: &str, arch: &'static str) -> Result<Compiled, CudaError> {
        if !crate::interpret::find_libraries()?.nvrtc {
            return Err(CudaError::MissingLibraries(vec![NVRTC]));
        }
        let version = nvrtc_version()?;
        let path = self
            .dir
            .join(format!("{name}-{arch}-{}.ptx", key(source, arch, version)));
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Ok(Compiled {
                ptx: Ptx::from_src(text),
                path,
                from_cache: true,
            });
        }
        let options = CompileOptions {
            arch: Some(arch),
            options: OPTIONS.iter().map(|o| o.to_string()).collect(),
            name: Some(format!("{name}.cu")),
            ..CompileOptions::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options).map_err(|e| {
            CudaError::Compile {
                kernel: name.to_string(),
                log: e.to_string(),
            }
        })?;
        write_atomically(&path, &ptx.to_src())?;
        Ok(Compiled {
            ptx,
            path,
            from_cache: false,
        })
    }
}

/// The version of the NVRTC that compiles here, `(major, minor)` (the CUDA interpreter's
/// reports `(0, 0)`). The caller has seen NVRTC load (cudarc panics otherwise).
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    crate::libraries::nvrtc_version().map_err(|status| CudaError::Compile {
        kernel: "(nvrtcVersion)".into(),
        log: status,
    })
}

/// Hex SHA-256 of the source, the architecture, the options and the NVRTC version (first 32
/// digits): PTX from a newer NVRTC than the driver knows fails to load, so another NVRTC is
/// another entry.
fn key(source: &str, arch: &str, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    h.update([0]);
    h.update(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    for o in OPTIONS {
        h.update([0]);
        h.update(o.as_bytes());
    }
    let mut hex = hex::encode(h.finalize());
    hex.truncate(32);
    hex
}

fn write_atomically(path: &Path, text: &str) -> Result<(), CudaError> {
    let fail = |e: std::io::Error| CudaError::Cache {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    // Unique per process and per call: two threads (or processes) compiling the same module
    // at once each rename their own whole file into place.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("ptx.{}.{n}.tmp", std::process::id()));
    std::fs::write(&tmp, text).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libraries::Libraries;

    const ADD: &str = r#"
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"#;

    #[test]
    fn keys_change_with_source_and_architecture() {
        let v = (12, 8);
        assert_eq!(key(ADD, "sm_90", v), key(ADD, "sm_90", v));
        assert_ne!(key(ADD, "sm_90", v), key(ADD, "sm_80", v));
        assert_ne!(
            key(ADD, "sm_90", v),
            key(&ADD.replace('+', "-"), "sm_90", v)
        );
        assert_ne!(key(ADD, "sm_90", v), key(ADD, "sm_90", (13, 0)));
        assert_eq!(arch_for((9, 0)), Some("sm_90"));
        assert_eq!(arch_for((1, 0)), None);
    }

    #[test]
    fn every_kernel_compiles_for_sm_80_and_sm_90_with_its_entry_points() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path());
        if !Libraries::find().nvrtc {
            assert!(
                std::env::var_os("CI").is_none(),
                "NVRTC must be found under CI"
            );
            eprintln!("skipped: no NVRTC");
            return;
        }
        for module in MODULES {
            for arch in ["sm_80", "sm_90"] {
                let compiled = match cache.ptx(module.name, module.source, arch) {
                    Ok(c) => c,
                    Err(e) => panic!("{} for {arch}: {e}", module.name),
                };
                let text = compiled.ptx.to_src();
                assert!(text.contains(&format!(".target {arch}")), "{}", module.name);
                for entry in module.entries {
                    assert!(
                        text.contains(&format!(".entry {entry}(")),
                        "{} for {arch} lacks entry {entry}",
                        module.name
                    );
                }
            }
        }
    }

    #[test]
    fn compiles_once_then_loads_from_the_cache_or_names_what_is_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = KernelCache::new(dir.path());
        if !Libraries::find().nvrtc {
            // CI installs NVRTC (scripts/test.sh); without it the answer names it.
            assert!(
                std::env::var_os("CI").is_none(),
                "NVRTC must be found under CI"
            );
            let e = cache.ptx("add", ADD, "sm_90").expect_err("no NVRTC");
            assert_eq!(e, CudaError::MissingLibraries(vec![NVRTC]));
            return;
        }
        if crate::interpret::builtin_nvrtc() {
            // The interpreter's NVRTC takes only Pagoda's own kernel modules.
            match cache
                .ptx("add", ADD, "sm_90")
                .expect_err("not one of Pagoda's")
            {
                CudaError::Compile { log, .. } => assert!(log.contains("interpreter"), "{log}"),
                other => panic!("{other}"),
            }
            return;
        }
        let first = cache.ptx("add", ADD, "sm_90").expect("compiles");
        assert!(!first.from_cache);
        let text = first.ptx.to_src();
        assert!(text.contains(".target sm_90"), "{text}");
        assert!(text.contains(".entry add"), "{text}");
        let again = cache.ptx("add", ADD, "sm_90").expect("cached");
        assert!(again.from_cache);
        assert_eq!(again.path, first.path);
        assert_eq!(again.ptx.to_src(), text);
        let other = cache.ptx("add", ADD, "sm_80").expect("compiles for sm_80");
        assert!(!other.from_cache, "another architecture is another entry");

        let broken = cache
            .ptx(
                "broken",
                "extern \"C\" __global__ void k() { nope; }",
                "sm_90",
            )
            .expect_err("does not compile");
        match broken {
            CudaError::Compile { kernel, log } => {
                assert_eq!(kernel, "broken");
                assert!(!log.is_empty());
            }
            other => panic!("{other}"),
        }
    }
}
