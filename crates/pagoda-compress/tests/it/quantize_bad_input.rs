//! Bad input to online quantization: unknown type names, types that cannot be targets, and
//! weights that cannot be quantized — each a clear error that names the culprit.

use crate::common::{f32_tensor, typed_tensor, weights};
use pagoda_compress::quantize::{quantize_weights, QuantOptions, QuantTarget};
use pagoda_compress::CompressError;
use pagoda_kernels::GgmlType;
use pagoda_model::gguf::{GgufFile, GgufWriter};
use pagoda_model::weights::Weights;

#[test]
fn unknown_and_unusable_type_names_list_the_valid_ones() {
    for (name, needle) in [
        ("q4", "unknown quantization type `q4`"),
        ("nf5", "unknown quantization type `nf5`"),
        ("int4-g48", "unknown quantization type `int4-g48`"),
        ("q3_k", "no Q3_K quantizer"),
        ("q2_k", "no Q2_K quantizer"),
        ("q8_k", "activations are quantized to"),
        ("q8_1", "activations are quantized to"),
    ] {
        let e = name.parse::<QuantTarget>().unwrap_err();
        assert!(
            matches!(e, CompressError::UnknownQuantType { .. }),
            "{name}"
        );
        let text = e.to_string();
        assert!(text.contains(needle), "{name}: {text}");
        assert!(text.contains("choose one of: q4_0,"), "{name}: {text}");
        assert!(text.contains("int4 (= int4-g32)"), "{name}: {text}");
    }
}

#[test]
fn a_non_finite_weight_is_refused_with_its_tensor_and_row() {
    let mut x = vec![0.5f32; 4 * 64];
    x[2 * 64 + 5] = f32::NAN;
    let w = weights([f32_tensor("blk.1.ffn_gate.weight", &[4, 64], &x)]);
    let e = quantize_weights(&w, "q8_0".parse().unwrap(), &QuantOptions::default())
        .expect_err("a NaN weight is an error");
    assert!(
        matches!(&e, CompressError::NonFinite { tensor, row: 2, col: 5, .. } if tensor == "blk.1.ffn_gate.weight"),
        "{e:?}"
    );
    assert!(e.to_string().contains("re-download"), "{e}");
}

#[test]
fn a_gguf_with_an_infinite_scale_is_refused() {
    // A Q8_0 matrix whose first block's f16 scale is +inf: the file reads, but its values
    // are not numbers, so quantizing it to another type stops with the tensor's name.
    let mut data = vec![0u8; 2 * 34];
    data[0..2].copy_from_slice(&half_inf());
    data[2] = 1;
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", "llama");
    g.add_tensor("blk.0.attn_v.weight", GgmlType::Q8_0, &[2, 32], data)
        .unwrap();
    let file = GgufFile::from_bytes("broken.gguf", g.to_bytes()).unwrap();
    let w = Weights::from_gguf(&file).unwrap();
    let e = quantize_weights(&w, "q4_0".parse().unwrap(), &QuantOptions::default())
        .expect_err("an infinite weight is an error");
    let text = e.to_string();
    assert!(text.contains("\"blk.0.attn_v.weight\" (Q8_0)"), "{text}");
    assert!(text.contains("row 0"), "{text}");
    // Asking for the type it already has leaves it alone: nothing to convert, no error.
    let (_, report) =
        quantize_weights(&w, "q8_0".parse().unwrap(), &Default::default()).expect("kept as is");
    assert_eq!(report.n_converted(), 0);
}

/// f16 +infinity, little-endian.
fn half_inf() -> [u8; 2] {
    0x7C00u16.to_le_bytes()
}

#[test]
fn models_without_weight_matrices_are_left_as_they_are() {
    // Only vectors (norms, biases): nothing to quantize, and the report says so.
    let w = weights([
        f32_tensor("output_norm.weight", &[64], &[1.0; 64]),
        typed_tensor("blk.0.attn_q.bias", GgmlType::F16, &[1, 64], &[0.5; 64]),
    ]);
    let (out, report) = quantize_weights(&w, "q4_k".parse().unwrap(), &Default::default()).unwrap();
    assert_eq!(report.n_converted(), 0);
    assert_eq!(report.n_kept(), 2);
    assert_eq!(out.len(), 2);
    assert!(report
        .to_string()
        .starts_with("quantized 0 tensors to Q4_K"));
}
