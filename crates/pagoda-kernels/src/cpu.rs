//! Run-time instruction set detection: which SIMD path the kernels may take on this CPU.
//!
//! Invariant: an [`Isa`] other than `Scalar` is only ever executed after
//! [`Isa::is_available`] said yes; the `unsafe` SIMD entry points rely on it.

use std::sync::OnceLock;

/// An instruction-set path of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the reference the other paths are tested against.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (+ VNNI and BF16 where present), on top of everything AVX2 needs.
    Avx512,
}

impl Isa {
    /// Lower-case name (`scalar`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        let f = features();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => f.avx2,
            Isa::Avx512 => f.avx512,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// CPU features the kernels care about, detected once.
#[derive(Clone, Copy, Debug, Default)]
#[allow(dead_code)] // vnni and bf16 pick kernels inside the AVX-512 path
pub(crate) struct Features {
    /// AVX2 + FMA + F16C.
    pub avx2: bool,
    /// AVX-512 F + BW + VL, plus the AVX2 set.
    pub avx512: bool,
    /// AVX-512 VNNI (`vpdpbusd` on zmm).
    pub avx512_vnni: bool,
    /// AVX-512 BF16 (`vdpbf16ps`).
    pub avx512_bf16: bool,
}

pub(crate) fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    Features {
        avx2,
        avx512,
        avx512_vnni: avx512 && is_x86_feature_detected!("avx512vnni"),
        avx512_bf16: avx512 && is_x86_feature_detected!("avx512bf16"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}

/// The fastest path this CPU can run (detected once, then cached).
pub fn best_isa() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    })
}

/// Every path this CPU can run, scalar first.
pub fn available_isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_isa_is_available_and_scalar_always_is() {
        let all = available_isas();
        assert_eq!(all[0], Isa::Scalar);
        assert!(all.contains(&best_isa()));
        assert_eq!(*all.last().unwrap(), best_isa());
    }
}
