//! Fuzz target: arbitrary bytes as a constraint spec (JSON schema, regex, Lark grammar or
//! choices), compiled and walked through
//! `pagoda_engine::constraint::exercise_untrusted_constraint`. Any panic, stack overflow or
//! timeout is a bug: a client's spec must be a 400 or a constrained generation, never the
//! end of the server.
//!
//! The first byte picks the kind; the rest, up to the first NUL, is the spec's text (a JSON
//! schema must parse as JSON, as the request parser would have made sure); the bytes after
//! the NUL steer the walk through the masks (each picks a token among the allowed ones).
//!
//! Run: `cd fuzz && cargo +nightly fuzz run constraint corpus/constraint seeds/constraint`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagoda_engine::constraint::exercise_untrusted_constraint;
use pagoda_engine::ConstraintSpec;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let (spec, steer) = match rest.iter().position(|&b| b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let text = String::from_utf8_lossy(spec).into_owned();
    let spec = match kind % 4 {
        0 => match serde_json::from_str(&text) {
            Ok(schema) => ConstraintSpec::JsonSchema(schema),
            Err(_) => return,
        },
        1 => ConstraintSpec::Regex(text),
        2 => ConstraintSpec::Lark(text),
        _ => ConstraintSpec::Choice(text.split('\n').map(str::to_string).collect()),
    };
    exercise_untrusted_constraint(&spec, steer);
});
