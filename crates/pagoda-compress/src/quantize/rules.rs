//! Which tensors of a model are quantized, and to which type: llama.cpp's rules
//! (`llama_tensor_get_type` and the checks around it in `llama_model_quantize_impl`).
//!
//! - Only weight matrices are quantized: names ending in `.weight` with two or more
//!   dimensions. Norms (`*norm*`), biases, 1-D tensors, position/type embeddings, rope
//!   factors and MoE router weights (`ffn_gate_inp`) keep their type, as llama.cpp does.
//! - Token embeddings are quantized like any matrix.
//! - The output head (`output.weight`, or `token_embd.weight` when the model ties them) gets
//!   Q6_K, or Q8_0 when its rows are not whole 256-blocks or the target is Q8_0 or INT8 —
//!   unless the target is a float type or the caller asks for a pure conversion.
//! - A matrix whose rows are not whole blocks of the chosen type falls back along
//!   [`fitting_type`] (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then F16).
//!
//! Invariant: a pure function of a tensor's name, shape and type and of the target; the
//! type it returns always fits the tensor's rows.

use super::target::fitting_type;
use super::QuantTarget;
use pagoda_kernels::{GgmlType, QK_K};
use pagoda_model::weights::{TensorView, Weights};

/// Name suffixes/parts of 2-D tensors that keep their type (llama.cpp's exclusions).
const KEEP_PARTS: [&str; 7] = [
    "norm",
    "ffn_gate_inp",
    "pos_embd",
    "token_types",
    "rope_freqs",
    "rope_factors",
    "ssm_conv1d",
];

/// What happens to one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Not a weight matrix (norm, bias, 1-D, excluded by name): left as it is.
    KeepNotMatrix,
    /// Already of the type it would get: left as it is, byte for byte.
    KeepSameType,
    /// Converted to `to`. `wanted` is the type the rules asked for before the row-length
    /// fallback (equal to `to` when nothing fell back).
    Convert { to: GgmlType, wanted: GgmlType },
}

/// True for the tensors llama.cpp quantizes: 2+-D `*.weight` tensors that are not excluded.
pub fn is_weight_matrix(view: &TensorView) -> bool {
    view.shape.len() >= 2
        && view.name.ends_with(".weight")
        && !KEEP_PARTS.iter().any(|p| view.name.contains(p))
}

/// The name of the tensor that serves as the output head: `output.weight`, or the token
/// embedding when the model has no separate head (tied embeddings).
pub fn output_head_name(weights: &Weights) -> &'static str {
    if weights.contains("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    }
}

/// The plan for `view` under `target`; `is_output` marks the output head, `pure` turns the
/// output-head rule off (every matrix gets the target, as llama.cpp's `--pure`).
pub fn plan(view: &TensorView, target: QuantTarget, is_output: bool, pure: bool) -> Plan {
    if !is_weight_matrix(view) {
        return Plan::KeepNotMatrix;
    }
    let cols = view.cols();
    let target = target.ty();
    let wanted = if is_output && !pure && target.is_quantized() {
        if matches!(target, GgmlType::Q8_0 | GgmlType::Int8) || cols % QK_K != 0 {
            GgmlType::Q8_0
        } else {
            GgmlType::Q6_K
        }
    } else {
        target
    };
    let to = fitting_type(wanted, cols);
    if to == view.ty {
        Plan::KeepSameType
    } else {
        Plan::Convert { to, wanted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, ty: GgmlType, shape: &[usize]) -> TensorView {
        let bytes = ty.row_bytes(shape[shape.len() - 1]).unwrap()
            * shape[..shape.len() - 1].iter().product::<usize>();
        TensorView::owned(name, ty, shape.to_vec(), vec![0; bytes]).unwrap()
    }

    fn t(s: &str) -> QuantTarget {
        s.parse().unwrap()
    }

    #[test]
    fn norms_biases_and_vectors_are_kept() {
        for (name, shape) in [
            ("blk.0.attn_norm.weight", &[64][..]),
            ("blk.0.attn_q.bias", &[64][..]),
            ("blk.0.attn_q_norm.weight", &[4, 16][..]),
            ("blk.0.ffn_gate_inp.weight", &[8, 64][..]),
            ("rope_freqs.weight", &[32][..]),
        ] {
            let v = view(name, GgmlType::F32, shape);
            assert_eq!(
                plan(&v, t("q8_0"), false, false),
                Plan::KeepNotMatrix,
                "{name}"
            );
        }
    }

    #[test]
    fn matrices_get_the_target_and_fall_back_on_short_rows() {
        let q = view("blk.0.attn_q.weight", GgmlType::F16, &[512, 512]);
        let to = |v: &TensorView, s| match plan(v, t(s), false, false) {
            Plan::Convert { to, .. } => to,
            other => panic!("{other:?}"),
        };
        assert_eq!(to(&q, "q4_k"), GgmlType::Q4_K);
        assert_eq!(to(&q, "f32"), GgmlType::F32);
        assert_eq!(plan(&q, t("f16"), false, false), Plan::KeepSameType);
        let small = view("blk.0.ffn_up.weight", GgmlType::F32, &[128, 64]);
        assert_eq!(
            plan(&small, t("q4_k"), false, false),
            Plan::Convert {
                to: GgmlType::Q5_0,
                wanted: GgmlType::Q4_K
            }
        );
        assert_eq!(to(&small, "q6_k"), GgmlType::Q8_0);
        let odd = view("blk.0.ffn_up.weight", GgmlType::F32, &[2, 40]);
        assert_eq!(to(&odd, "q4_0"), GgmlType::F16);
    }

    #[test]
    fn the_output_head_gets_q6_k_or_q8_0_unless_pure() {
        let head = view("output.weight", GgmlType::F16, &[320, 512]);
        let narrow = view("output.weight", GgmlType::F16, &[320, 576]);
        let got = |v: &TensorView, s, pure| match plan(v, t(s), true, pure) {
            Plan::Convert { to, .. } => to,
            other => panic!("{other:?}"),
        };
        assert_eq!(got(&head, "q4_0", false), GgmlType::Q6_K);
        assert_eq!(got(&head, "q8_0", false), GgmlType::Q8_0);
        assert_eq!(got(&narrow, "q4_k", false), GgmlType::Q8_0);
        assert_eq!(got(&head, "q4_0", true), GgmlType::Q4_0);
        assert_eq!(got(&head, "bf16", false), GgmlType::BF16);
        let mut w = Weights::new();
        w.insert(view("token_embd.weight", GgmlType::F16, &[4, 32]))
            .unwrap();
        assert_eq!(output_head_name(&w), "token_embd.weight");
        w.insert(view("output.weight", GgmlType::F16, &[4, 32]))
            .unwrap();
        assert_eq!(output_head_name(&w), "output.weight");
    }
}
