//! Fuzz target: arbitrary bytes parsed as a GGUF model file, then every loader step run on
//! whatever parses. Any panic, abort or out-of-bounds read is a bug.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run gguf_reader` (seed corpus: `fuzz/seeds/`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pagoda_model::source::exercise_untrusted_gguf(data.to_vec());
});
