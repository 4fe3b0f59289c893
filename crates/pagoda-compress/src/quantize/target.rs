//! [`QuantTarget`]: the weight type a user asks for by name (`q4_k`, `int8`, ...), and the
//! fallback chain for matrices whose rows that type cannot hold.
//!
//! Invariant: a [`QuantTarget`] is always a GGUF type that pagoda-kernels can both quantize
//! to (a reference `Block::quantize`) and multiply by (a matmul row kernel); activation-only
//! formats (Q8_1, Q8_K) and formats without a quantizer (Q2_K, Q3_K) are refused when parsed.

use crate::CompressError;
use pagoda_kernels::GgmlType;

/// The weight types a model can be quantized to at load time, in the order `--help` lists
/// them (block types first, by size, then floats).
pub const TARGETS: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// Short names that stand for a GGUF type. For now they are aliases of the nearest block
/// type (`int8` is Q8_0: int8 values with one f16 scale per 32; `int4` is Q4_0); true
/// per-channel INT8, group-wise INT4 and NF4 formats are separate types still to come.
pub const ALIASES: [(&str, GgmlType); 2] = [("int8", GgmlType::Q8_0), ("int4", GgmlType::Q4_0)];

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
        let mut names: Vec<String> = TARGETS
            .iter()
            .map(|t| t.name().to_ascii_lowercase())
            .collect();
        for (alias, ty) in ALIASES {
            names.push(format!("{alias} (= {})", ty.name().to_ascii_lowercase()));
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

    /// Case-insensitive: `q4_k`, `Q4_K`, `int8`; a `-` may stand for `_` (`q4-k`).
    fn from_str(s: &str) -> Result<QuantTarget, CompressError> {
        let key = s.trim().to_ascii_lowercase().replace('-', "_");
        if let Some((_, ty)) = ALIASES.iter().find(|(a, _)| *a == key) {
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
/// Q5_1, Q6_K → Q8_0, and any 32-block type → F16. `None` when `ty` fits every row length
/// (the float types).
pub fn fallback(ty: GgmlType) -> Option<GgmlType> {
    match ty {
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
            ("int8", GgmlType::Q8_0),
            ("INT4", GgmlType::Q4_0),
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
        assert!(e.contains("q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, f16, bf16, f32"));
        assert!(e.contains("int8 (= q8_0), int4 (= q4_0)"), "{e}");
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
        // Every target ends on a type that fits any row length.
        for ty in TARGETS {
            for cols in [1, 31, 32, 96, 256, 300] {
                assert_eq!(cols % fitting_type(ty, cols).block_size(), 0, "{ty} {cols}");
            }
        }
    }
}
