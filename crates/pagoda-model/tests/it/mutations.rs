//! Property: no mutation or truncation of a valid GGUF makes the reader, the config parser,
//! the weight views or the tokenizer builder panic or read out of bounds (the same body the
//! cargo-fuzz target `gguf_reader` runs on arbitrary bytes).

use crate::common::tiny_llama;
use proptest::prelude::*;

/// Everything a loader does with a file; must return, never panic.
pub fn exercise(bytes: Vec<u8>) {
    pagoda_model::source::exercise_untrusted_gguf(bytes)
}

fn valid() -> Vec<u8> {
    tiny_llama().to_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_byte_mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut b = valid();
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        exercise(b);
    }

    #[test]
    fn truncations_never_panic(cut in any::<prop::sample::Index>()) {
        let b = valid();
        let n = cut.index(b.len());
        exercise(b[..n].to_vec());
    }

    #[test]
    fn large_field_values_never_panic(
        at in any::<prop::sample::Index>(),
        v in prop_oneof![Just(u64::MAX), Just(u64::MAX / 2), Just(1u64 << 32), Just(1u64 << 40), 0u64..1000],
    ) {
        // Overwrite an 8-byte window with a count-like value (lengths, counts, offsets, dims).
        let mut b = valid();
        let i = at.index(b.len() - 8);
        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        exercise(b);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_magic_never_panic(
        tail in prop::collection::vec(any::<u8>(), 0..256)
    ) {
        let mut b = b"GGUF\x03\x00\x00\x00".to_vec();
        b.extend(tail);
        exercise(b);
    }
}

/// `PAGODA_WRITE_FUZZ_SEED=path cargo test -p pagoda-model --test it write_fuzz_seed` writes the
/// tiny valid GGUF used as the fuzzer's seed corpus.
#[test]
fn write_fuzz_seed() {
    if let Some(p) = std::env::var_os("PAGODA_WRITE_FUZZ_SEED") {
        std::fs::write(p, valid()).unwrap();
    }
}

fn valid_safetensors() -> Vec<u8> {
    let f32s = |n: usize| {
        (0..n)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    pagoda_model::safetensors::write_safetensors(&[
        ("model.embed_tokens.weight", "F32", vec![3, 4], f32s(12)),
        (
            "model.norm.weight",
            "BF16",
            vec![4],
            vec![0x80, 0x3f, 0, 0x40, 0, 0, 0, 0],
        ),
        ("lm_head.weight", "F16", vec![3, 4], vec![0; 24]),
    ])
}

fn exercise_safetensors(bytes: Vec<u8>) {
    if let Ok(f) = pagoda_model::safetensors::SafetensorsFile::from_bytes("fuzz.safetensors", bytes)
    {
        for t in f.tensors() {
            let _ = t.data().last();
            let _ = t.to_f32();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn safetensors_mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut b = valid_safetensors();
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        let n = cut.index(b.len() + 1);
        exercise_safetensors(b[..n.max(1).min(b.len())].to_vec());
        exercise_safetensors(b);
    }

    #[test]
    fn safetensors_header_digit_edits_never_panic(
        at in any::<prop::sample::Index>(),
        digit in b'0'..=b'9',
    ) {
        // Change one digit in the JSON header: shapes and offsets go wrong in every way.
        let mut b = valid_safetensors();
        let header_end = 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let digits: Vec<usize> = (8..header_end).filter(|&i| b[i].is_ascii_digit()).collect();
        let i = digits[at.index(digits.len())];
        b[i] = digit;
        exercise_safetensors(b);
    }
}
