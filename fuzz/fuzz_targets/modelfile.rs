//! Fuzz target: arbitrary bytes as a Modelfile, through `pagoda_store::modelfile`. Any panic or
//! failed assertion is a bug.
//!
//! The bytes are read as UTF-8 with invalid sequences replaced (`from_utf8_lossy`): valid UTF-8
//! (all that `pagoda create`, which reads the file with `read_to_string`, can hand the parser)
//! passes unchanged, and a mutation that breaks the encoding still reaches the parser as
//! text with a U+FFFD in it instead of being thrown away.
//!
//! Asserted: an error names a line inside the text (all but a missing FROM); what parses is
//! valid (`Modelfile::validate`), renders to text that parses back to an equal value (the
//! `PartialEq` the crate's render → parse property test uses), and survives the manifest's
//! serde JSON round trip; Go-template detection runs on the text and the TEMPLATE.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run modelfile corpus/modelfile` (seeds:
//! `fuzz/seeds/modelfile/`, see fuzz/README.md).

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagoda_store::modelfile::{looks_like_go_template, Modelfile, ModelfileError};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = looks_like_go_template(&text);
    let m = match Modelfile::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            error_names_a_line(&text, &e);
            return;
        }
    };
    if let Err(e) = m.validate() {
        panic!("parsed but invalid ({e}): {m:?}");
    }
    if let Some(t) = &m.template {
        let _ = looks_like_go_template(t);
    }

    let rendered = m.render();
    match Modelfile::parse(&rendered) {
        Ok(back) => assert_eq!(back, m, "rendered as {rendered:?}"),
        Err(e) => panic!("{m:?} rendered as {rendered:?} does not parse: {e}"),
    }

    let json = serde_json::to_string(&m).expect("a Modelfile serializes");
    match serde_json::from_str::<Modelfile>(&json) {
        Ok(back) => assert_eq!(back, m, "serialized as {json}"),
        Err(e) => panic!("{m:?} serialized as {json} does not read back: {e}"),
    }
});

/// Every error but a missing FROM starts `line N:` with N a line of `text` (1-based; the
/// parser counts `\n` only).
fn error_names_a_line(text: &str, e: &ModelfileError) {
    let msg = e.to_string();
    if *e == ModelfileError::MissingFrom {
        return;
    }
    let line = msg
        .strip_prefix("line ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse::<usize>().ok());
    let lines = text.matches('\n').count() + 1;
    match line {
        Some(n) => assert!((1..=lines).contains(&n), "{msg} for {lines} lines"),
        None => panic!("the error does not name a line: {msg}"),
    }
}
