//! Small model files built in the test: a tiny Llama-shaped GGUF with a byte-level BPE
//! vocabulary, and helpers for byte surgery on GGUF bytes.

use pagoda_kernels::GgmlType;
use pagoda_model::gguf::{GgufArray, GgufValue, GgufWriter};

pub const HIDDEN: usize = 32;
pub const VOCAB: usize = 8;

/// A valid tiny llama GGUF: one layer, hidden 32, 2 heads / 1 KV head, FFN 64, vocab 8.
pub fn tiny_llama() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_str("general.name", "tiny")
        .add_u32("llama.block_count", 1)
        .add_u32("llama.embedding_length", HIDDEN as u32)
        .add_u32("llama.attention.head_count", 2)
        .add_u32("llama.attention.head_count_kv", 1)
        .add_u32("llama.feed_forward_length", 64)
        .add_u32("llama.context_length", 128)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add_f32("llama.rope.freq_base", 10000.0)
        .add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "smollm")
        .add_str_array(
            "tokenizer.ggml.tokens",
            [
                "<|endoftext|>",
                "a",
                "b",
                "c",
                "ab",
                "Ġ",
                "Ġa",
                "<|im_end|>",
            ]
            .map(String::from)
            .to_vec(),
        )
        .add_metadata(
            "tokenizer.ggml.token_type",
            GgufValue::Array(GgufArray::I32(vec![3, 1, 1, 1, 1, 1, 1, 3])),
        )
        .add_str_array(
            "tokenizer.ggml.merges",
            vec!["a b".to_string(), "Ġ a".to_string()],
        )
        .add_u32("tokenizer.ggml.bos_token_id", 0)
        .add_u32("tokenizer.ggml.eos_token_id", 7)
        .add_bool("tokenizer.ggml.add_bos_token", false)
        .add_str(
            "tokenizer.chat_template",
            pagoda_model::chat_template::CHATML_TEMPLATE,
        );
    let ramp = |n: usize| (0..n).map(|i| i as f32 * 0.01).collect::<Vec<f32>>();
    w.add_f32_tensor("token_embd.weight", &[VOCAB, HIDDEN], &ramp(VOCAB * HIDDEN))
        .unwrap();
    w.add_f32_tensor("output_norm.weight", &[HIDDEN], &[1.0; HIDDEN])
        .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        GgmlType::Q8_0,
        &[HIDDEN, HIDDEN],
        vec![0; HIDDEN * 34],
    )
    .unwrap();
    w
}

/// Position of the first occurrence of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// Byte offset of the fields of tensor `name`'s info: (n_dims, ne[0], type, offset).
pub fn tensor_info_fields(bytes: &[u8], name: &str) -> (usize, usize, usize, usize) {
    // The name is stored as u64 length + bytes; search for length+bytes to skip metadata hits.
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let start = bytes
        .windows(pat.len())
        .rposition(|w| w == pat.as_slice())
        .expect("tensor info");
    let n_dims_at = start + pat.len();
    let n_dims = u32::from_le_bytes(bytes[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    let ne0_at = n_dims_at + 4;
    let ty_at = ne0_at + 8 * n_dims;
    (n_dims_at, ne0_at, ty_at, ty_at + 4)
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
