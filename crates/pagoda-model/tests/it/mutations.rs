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
