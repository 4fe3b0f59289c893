//! [`QuantTarget`]: the weight type a user asks for by name (`q4_k`, `int8`, `int4-g64`,
//! `nf4-dq`, ...), and the fallback chain for matrices whose rows that type cannot hold.
//!
//! Names: the GGUF types by their name (`q4_0` … `f32`), and the Pagoda-internal types
//! `int8` (per-channel), `int4-g{32,64,128}[-sym]` (group-wise; asymmetric unless `-sym`),
//! `nf4`, `nf4-dq`; `int4` alone is `int4-g32`. Case-insensitive, `-` and `_` alike.
//!
//! Invariant: a [`QuantTarget`] is always a type that pagoda-kernels can both quantize to
//! (a reference quantizer) and multiply by (a matmul row kernel): a GGUF type or a
//! Pagoda-internal one (which lives only in memory: the GGUF writer refuses it);
//! activation-only formats (Q8_1, Q8_K) and formats without a quantizer (Q2_K, Q3_K) are
//! refused when parsed. Every fallback chain ends on a type that fits any row length.

use crate::CompressError;
use pagoda_kernels::GgmlType;

/// The weight types a model can be quantized to at load time, in the order `--help` lists
/// them (block types first, by size, then floats).
pub const TARGETS: [GgmlType; 20] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Int8,
    GgmlType::Int4G32,
    GgmlType::Int4G64,
    GgmlType::Int4G128,
    GgmlType::Int4G32Sym,
    GgmlType::Int4G64Sym,
    GgmlType::Int4G128Sym,
    GgmlType::Nf4,
    GgmlType::Nf4Dq,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// Short names that stand for another type: `int4` is INT4 with groups of 32, asymmetric.
pub const ALIASES: [(&str, GgmlType); 1] = [("int4", GgmlType::Int4G32)];

/// The name users type for `ty`: lower case, `-` between the parts of internal types
/// (`int4-g64-sym`), GGUF names as GGUF spells them (`q4_0`).
pub fn user_name(ty: GgmlType) -> String {
    let name = ty.name().to_ascii_lowercase();
    if ty.is_internal() {
        name.replace('_', "-")
    } else {
        name
    }
}

/// A weight type to quantize a model to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantTarget(GgmlType);

impl QuantTarget {
    /// The target for `ty`, if `ty` is one of [`TARGETS`].
    pub fn new(ty: GgmlType) -> Result<QuantTarget, CompressError> {
        if TARGETS.contains(&ty) {
            Ok(QuantTarget(ty))
        } else {
            Err(unknown(ty.name(), ty))
        }
    }

    /// The GGUF type.
    pub fn ty(self) -> GgmlType {
        self.0
    }

    /// Every accepted name, lower case, comma separated, aliases last with what they mean:
    /// the list error messages and `--help` show.
    pub fn valid_names() -> String {
        let mut names: Vec<String> = TARGETS.iter().map(|&t| user_name(t)).collect();
        for (alias, ty) in ALIASES {
            names.push(format!("{alias} (= {})", user_name(ty)));
        }
        names.join(", ")
    }
}

/// The error for `name`, a known GGUF type that cannot be a target.
fn unknown(name: &str, ty: GgmlType) -> CompressError {
    let why = match ty {
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            format!(" ({ty} is the format activations are quantized to, not a weight type)")
        }
        GgmlType::Q2_K | GgmlType::Q3_K => {
            format!(" (Pagoda has no {ty} quantizer yet; it can only read {ty} files)")
        }
        _ => String::new(),
    };
    CompressError::UnknownQuantType {
        name: name.to_string(),
        why,
        valid: QuantTarget::valid_names(),
    }
}

impl std::str::FromStr for QuantTarget {
    type Err = CompressError;

    /// Case-insensitive: `q4_k`, `Q4_K`, `int8`, `int4-g128-sym`; `-` and `_` alike.
    fn from_str(s: &str) -> Result<QuantTarget, CompressError> {
        let key = s.trim().to_ascii_lowercase().replace('-', "_");
        if let Some((_, ty)) = ALIASES.iter().find(|(a, _)| a.replace('-', "_") == key) {
            return Ok(QuantTarget(*ty));
        }
        match key.parse::<GgmlType>() {
            Ok(ty) if TARGETS.contains(&ty) => Ok(QuantTarget(ty)),
            Ok(ty) => Err(unknown(s, ty)),
            Err(_) => Err(CompressError::UnknownQuantType {
                name: s.to_string(),
                why: String::new(),
                valid: QuantTarget::valid_names(),
            }),
        }
    }
}

impl std::fmt::Display for QuantTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

/// The type llama.cpp falls back to when a matrix's rows are not a whole number of `ty`'s
/// blocks (`llama_tensor_get_type`: K-quants need 256-column rows): Q4_K → Q5_0, Q5_K →
/// Q5_1, Q6_K → Q8_0, and any 32-block type → F16. The internal types halve their group
/// first: INT4 g128 → g64 → g32 (same symmetry), NF4 / NF4_DQ (64) → INT4 g32 symmetric,
/// then F16. `None` when `ty` fits every row length (the float types).
pub fn fallback(ty: GgmlType) -> Option<GgmlType> {
    match ty {
        GgmlType::Int4G128 => Some(GgmlType::Int4G64),
        GgmlType::Int4G64 => Some(GgmlType::Int4G32),
        GgmlType::Int4G128Sym => Some(GgmlType::Int4G64Sym),
        GgmlType::Int4G64Sym | GgmlType::Nf4 | GgmlType::Nf4Dq => Some(GgmlType::Int4G32Sym),
        GgmlType::Q4_K => Some(GgmlType::Q5_0),
        GgmlType::Q5_K => Some(GgmlType::Q5_1),
        GgmlType::Q6_K | GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q8_K => Some(GgmlType::Q8_0),
        t if t.is_quantized() => Some(GgmlType::F16),
        _ => None,
    }
}

/// The first type of `ty`'s fallback chain whose blocks fit rows of `cols` elements.
pub fn fitting_type(ty: GgmlType, cols: usize) -> GgmlType {
    let mut t = ty;
    while cols % t.block_size() != 0 {
        match fallback(t) {
            Some(next) => t = next,
            None => break,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_case_insensitively_with_aliases() {
        for (text, ty) in [
            ("q8_0", GgmlType::Q8_0),
            ("Q4_K", GgmlType::Q4_K),
            ("q6-k", GgmlType::Q6_K),
            (" bf16 ", GgmlType::BF16),
            ("int8", GgmlType::Int8),
            ("INT4", GgmlType::Int4G32),
            ("int4-g32", GgmlType::Int4G32),
            ("int4_g64", GgmlType::Int4G64),
            ("int4-g128-sym", GgmlType::Int4G128Sym),
            ("Int4-G32-Sym", GgmlType::Int4G32Sym),
            ("nf4", GgmlType::Nf4),
            ("nf4-dq", GgmlType::Nf4Dq),
            ("NF4_DQ", GgmlType::Nf4Dq),
        ] {
            assert_eq!(text.parse::<QuantTarget>().unwrap().ty(), ty, "{text}");
        }
        for ty in TARGETS {
            let t: QuantTarget = ty.name().parse().unwrap();
            assert_eq!(t.to_string(), ty.name());
            assert_eq!(QuantTarget::new(ty).unwrap(), t);
        }
    }

    #[test]
    fn bad_names_list_the_valid_ones_and_say_why() {
        let e = "q4_k_x".parse::<QuantTarget>().unwrap_err().to_string();
        assert!(e.contains("unknown quantization type `q4_k_x`"), "{e}");
        assert!(
            e.contains(
                "q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, int8, int4-g32, int4-g64, \
                 int4-g128, int4-g32-sym, int4-g64-sym, int4-g128-sym, nf4, nf4-dq, f16, bf16, f32"
            ),
            "{e}"
        );
        assert!(e.contains("int4 (= int4-g32)"), "{e}");
        for bad in ["int4-g16", "int4-g64-asym", "nf8", "int3"] {
            let e = bad.parse::<QuantTarget>().unwrap_err().to_string();
            assert!(e.contains("int4-g128-sym") && e.contains(bad), "{e}");
        }
        let e = "q8_k".parse::<QuantTarget>().unwrap_err().to_string();
        assert!(e.contains("activations"), "{e}");
        let e = "Q3_K".parse::<QuantTarget>().unwrap_err().to_string();
        assert!(e.contains("no Q3_K quantizer"), "{e}");
        assert!(QuantTarget::new(GgmlType::Q2_K).is_err());
        assert!("".parse::<QuantTarget>().is_err());
    }

    #[test]
    fn fallbacks_follow_llama_cpp() {
        assert_eq!(fitting_type(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(fitting_type(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(fitting_type(GgmlType::Q5_K, 64), GgmlType::Q5_1);
        assert_eq!(fitting_type(GgmlType::Q6_K, 128), GgmlType::Q8_0);
        assert_eq!(fitting_type(GgmlType::Q4_K, 48), GgmlType::F16);
        assert_eq!(fitting_type(GgmlType::Q8_0, 33), GgmlType::F16);
        assert_eq!(fitting_type(GgmlType::F16, 7), GgmlType::F16);
        assert_eq!(fitting_type(GgmlType::Int4G128, 192), GgmlType::Int4G64);
        assert_eq!(
            fitting_type(GgmlType::Int4G128Sym, 96),
            GgmlType::Int4G32Sym
        );
        assert_eq!(fitting_type(GgmlType::Nf4Dq, 96), GgmlType::Int4G32Sym);
        assert_eq!(fitting_type(GgmlType::Nf4, 128), GgmlType::Nf4);
        assert_eq!(fitting_type(GgmlType::Int8, 48), GgmlType::F16);
        // Every target ends on a type that fits any row length.
        for ty in TARGETS {
            for cols in [1, 31, 32, 96, 256, 300] {
                assert_eq!(cols % fitting_type(ty, cols).block_size(), 0, "{ty} {cols}");
            }
        }
    }

    proptest::proptest! {
        /// Any text parses to a target or to an error listing the valid names, never a panic;
        /// every valid name survives case and separator changes.
        #[test]
        fn parsing_never_panics_and_names_round_trip(text in "\\PC{0,24}", upper in proptest::bool::ANY) {
            match text.parse::<QuantTarget>() {
                Ok(t) => proptest::prop_assert!(TARGETS.contains(&t.ty())),
                Err(e) => proptest::prop_assert!(e.to_string().contains("nf4-dq")),
            }
            for ty in TARGETS {
                let name = user_name(ty);
                let name = if upper { name.to_ascii_uppercase().replace('-', "_") } else { name };
                proptest::prop_assert_eq!(name.parse::<QuantTarget>().map(|t| t.ty()).ok(), Some(ty));
            }
        }
    }
}
