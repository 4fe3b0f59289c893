//! Constrained decoding: a request's [`ConstraintSpec`] compiled to a grammar, and per choice
//! a token mask applied to the logits before sampling, so the output always matches.
//!
//! The grammar engine is [llguidance](https://github.com/guidance-ai/llguidance): pure Rust
//! (no C++ build, no Python), the engine vLLM, SGLang and llama.cpp use for structured output.
//! It runs an Earley parser over a lexer of derivative-based regexes and walks the
//! tokenizer's vocabulary as a token trie, so the mask for a 49k–152k vocabulary costs tens of
//! microseconds in the common states rather than a pass over every token's text.
//!
//! How it is wired:
//! - [`Constraints`]: one per engine (per tokenizer), shared (`Arc`) by the handle and the
//!   core. It builds llguidance's token environment (every token's bytes, in a trie) once, on
//!   the first constrained request, and compiles specs against it: [`Constraints::compile`].
//!   [`EngineHandle::submit`](crate::EngineHandle::submit) compiles on the caller's thread,
//!   so a spec that does not compile fails the submit with
//!   [`EngineError::InvalidConstraint`](crate::EngineError::InvalidConstraint), and the
//!   engine thread never pays for compiling. [`validate`] is the same check for a front end
//!   that has only a tokenizer (it builds a token environment of its own each call).
//! - [`ChoiceConstraint`]: one per choice (`n > 1`: each choice a deep copy of the compiled
//!   grammar's fresh state). The step computes the masks of every constrained choice it
//!   samples in parallel (rayon) before sampling; no work at all when no choice of the step
//!   is constrained. Sampling sets every disallowed logit to `-inf` before logit bias,
//!   penalties, temperature and truncation ([`crate::sampling::Sampler::try_sample_masked`]).
//! - JSON schemas are compiled with closed objects by default ([`crate::closed_schema`]): an
//!   object listing `properties` allows no other keys unless it says so.
//! - Speculative decoding is off for constrained requests (their sequences are never offered
//!   to the speculator); prefix caching is unaffected (it is prompt side).
//!
//! Invariants:
//! - a choice's matcher has consumed exactly the choice's kept output tokens, in order; the
//!   mask in hand, if any, is the one for that state (consuming a token drops it);
//! - a token the mask disallows is never sampled (its logit is `-inf`), so the output is
//!   always a prefix of a string the grammar accepts;
//! - the choice's end tokens (EOS, unless `ignore_eos`, and the request's stop token ids)
//!   are allowed exactly where the grammar accepts; with a constraint, EOS ends the choice
//!   there even under `ignore_eos` (nothing could follow it);
//! - when the grammar is complete (accepting and nothing else allowed) after a token, the
//!   choice ends with `FinishReason::Stop` without sampling an EOS;
//! - a matcher error (a step beyond [`LIMITS`]' fuel, or a bug) fails the request with a
//!   message naming it; the rest of the batch goes on.
//!
//! Complexity limits (documented for clients; exceeding one is an error, never a hang):
//! [`MAX_SPEC_BYTES`] of schema, regex, grammar or choices text, [`MAX_CHOICES`] choices,
//! nesting depth ([`crate::constraint_depth`]: schema levels and `$ref` chains, Lark rule
//! chains and brackets), and llguidance's [`ParserLimits`] as set in [`LIMITS`]: grammar
//! size, lexer fuel at compile time and per token, Earley items per token, lexer states.
//! Compiling recurses over the spec, so it runs on a deep stack of its own
//! ([`pagoda_model::isolated`]), never on the caller's (an async worker's 2 MiB would
//! overflow and abort the process); a spec that matches nothing at all is refused when it
//! is compiled.

use crate::constraint_depth;
use crate::request::ConstraintSpec;
use llguidance::api::{ParserLimits, StopReason, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use pagoda_model::isolated::{run_isolated, DEEP_STACK_BYTES};
use pagoda_model::tokenizer::Tokenizer;
use std::sync::{Arc, OnceLock};

/// Most bytes of a spec's text: a JSON schema serialized, a regex, a Lark grammar, or the
/// choices together.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Most strings a [`ConstraintSpec::Choice`] may list.
pub const MAX_CHOICES: usize = 4096;

/// The parser limits every constraint is compiled under (llguidance's meaning; speeds from
/// its docs). Compile time: at most `max_grammar_size` symbols in productions and
/// `initial_lexer_fuel` spent building the lexer (~20 ms); per token: at most
/// `step_lexer_fuel` (~14 ms) and `step_max_items` Earley items (~2.5 ms) to compute a mask.
pub const LIMITS: ParserLimits = ParserLimits {
    max_items_in_row: 2000,
    initial_lexer_fuel: 1_000_000,
    step_lexer_fuel: 200_000,
    step_max_items: 50_000,
    max_lexer_states: 250_000,
    max_grammar_size: 200_000,
    precompute_large_lexemes: true,
    verbose_errors: false,
};

/// Why a constraint cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The model's tokenizer cannot be turned into token bytes (neither byte-level BPE nor
    /// byte fallback).
    #[error("constrained decoding is not supported for this model's tokenizer: {0}")]
    Tokenizer(String),
    /// The spec is beyond the documented limits ([`MAX_SPEC_BYTES`], [`MAX_CHOICES`]).
    #[error("{0}")]
    TooLarge(String),
    /// The spec does not compile: the message names the problem (llguidance's words).
    #[error("{0}")]
    Invalid(String),
}

/// The constraint side of one engine: its tokenizer's token environment (built once, on
/// first use) and the compiler of specs against it. Cheap to share (`Arc`).
pub struct Constraints {
    tokenizer: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, ConstraintError>>,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints")
            .field("ready", &self.factory.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Constraints {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Constraints {
            tokenizer,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, ConstraintError> {
        self.factory
            .get_or_init(|| factory(&self.tokenizer))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles `spec` on a deep stack of its own ([`pagoda_model::isolated`]): `Err` names
    /// what is wrong with it, or which limit it crosses.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<CompiledConstraint, ConstraintError> {
        let factory = self.factory()?;
        isolated(|| compile_with(factory, spec))
    }

    /// The size of the token trie's vocabulary (building it if needed).
    pub fn vocab_size(&self) -> Result<usize, ConstraintError> {
        Ok(self.factory()?.tok_env().tok_trie().vocab_size())
    }
}

/// Checks that `spec` compiles against `tokenizer`, as a submit would, without an engine.
/// Builds the token environment each call (tens to hundreds of milliseconds for a large
/// vocabulary): a front end holding an [`EngineHandle`](crate::EngineHandle) should use
/// [`EngineHandle::validate_constraint`](crate::EngineHandle::validate_constraint), which
/// reuses the engine's.
pub fn validate(spec: &ConstraintSpec, tokenizer: &Tokenizer) -> Result<(), ConstraintError> {
    check_size(spec)?;
    let factory = factory(tokenizer)?;
    isolated(|| compile_with(&factory, spec)).map(|_| ())
}

/// Runs a compilation on a thread whose stack holds the deepest spec [`check_limits`] lets
/// through; a panic in the grammar engine is that spec's error, not the caller's.
fn isolated(
    compile: impl FnOnce() -> Result<CompiledConstraint, ConstraintError> + Send,
) -> Result<CompiledConstraint, ConstraintError> {
    run_isolated("compiling the constraint", DEEP_STACK_BYTES, compile)
        .map_err(|e| ConstraintError::Invalid(e.to_string()))?
}

/// Compiles `spec` against a vocabulary of the 256 single bytes, then walks up to 64 tokens
/// through its masks, each picked by the next byte of `steer` among the allowed ones —
/// discarding every result. Must never panic or overflow a stack, whatever the spec; shared
/// by the property tests below and the cargo-fuzz target `constraint`.
#[doc(hidden)]
pub fn exercise_untrusted_constraint(spec: &ConstraintSpec, steer: &[u8]) {
    static FACTORY: OnceLock<ParserFactory> = OnceLock::new();
    let factory = FACTORY.get_or_init(|| {
        let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
        let mut f = ParserFactory::new_simple(&env).expect("a byte vocabulary always builds");
        f.quiet();
        *f.limits_mut() = LIMITS.clone();
        f
    });
    let Ok(compiled) = isolated(|| compile_with(factory, spec)) else {
        return;
    };
    let eos = factory.tok_env().tok_trie().eos_token();
    let mut choice = compiled.for_choice(&[eos]);
    for &b in steer.iter().take(64) {
        let Ok(mask) = choice.mask() else { return };
        let allowed: Vec<u32> = (0..256u32).filter(|&t| mask.is_allowed(t)).collect();
        let Some(&token) = allowed.get(usize::from(b) % allowed.len().max(1)) else {
            return;
        };
        match choice.consume(token) {
            Ok(false) => {}
            Ok(true) | Err(_) => return,
        }
    }
}

/// A compiled spec in its initial state: the first choice's matcher, and the template the
/// other choices of an `n > 1` request are copied from.
pub struct CompiledConstraint {
    matcher: Matcher,
    /// The tokens allowed first (computed when compiling: a grammar that allows nothing is
    /// the client's error, found before anything runs).
    first_mask: SimpleVob,
    vocab: usize,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

impl CompiledConstraint {
    /// A fresh matcher for one choice, whose end tokens (EOS, stop token ids) are
    /// `end_tokens`.
    pub fn for_choice(&self, end_tokens: &[u32]) -> ChoiceConstraint {
        ChoiceConstraint {
            matcher: self.matcher.deep_clone(),
            mask: Some(self.first_mask.clone()),
            end_tokens: end_tokens.to_vec(),
            vocab: self.vocab,
        }
    }
}

/// One choice's grammar state and the mask for its next token (see the module docs'
/// invariants).
pub struct ChoiceConstraint {
    matcher: Matcher,
    /// The allowed tokens in the current state, once computed.
    mask: Option<SimpleVob>,
    /// Tokens that end the choice: allowed exactly where the grammar accepts.
    end_tokens: Vec<u32>,
    /// The token trie's vocabulary (ids at or above it are never allowed).
    vocab: usize,
}

impl std::fmt::Debug for ChoiceConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChoiceConstraint")
            .field("mask_ready", &self.mask.is_some())
            .finish_non_exhaustive()
    }
}

impl ChoiceConstraint {
    /// Computes the mask of the current state unless it is in hand. `Err`: the matcher
    /// failed (a step beyond the limits' fuel, or a bug).
    pub fn prepare(&mut self) -> Result<(), String> {
        if self.mask.is_none() {
            let mask = self
                .matcher
                .compute_mask()
                .map_err(|e| failure_text(&self.matcher, &e))?;
            self.mask = Some(mask);
        }
        Ok(())
    }

    /// The allowed tokens of the current state (computing them if needed).
    pub fn mask(&mut self) -> Result<&SimpleVob, String> {
        self.prepare()?;
        self.mask
            .as_ref()
            .ok_or_else(|| "constraint mask missing after computing it".to_string())
    }

    /// The grammar accepts what was consumed so far (an end token may come now).
    pub fn is_accepting(&mut self) -> Result<bool, String> {
        self.matcher
            .is_accepting()
            .map_err(|e| failure_text(&self.matcher, &e))
    }

    /// Sets every logit the grammar disallows in the current state to `-inf` (ids beyond the
    /// trie's vocabulary too); the end tokens keep their logit exactly where it accepts.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let ends: Vec<(usize, f32)> = self
            .end_tokens
            .iter()
            .filter_map(|&t| logits.get(t as usize).map(|&x| (t as usize, x)))
            .collect();
        let accepting = if ends.is_empty() {
            false
        } else {
            self.is_accepting()?
        };
        let mask = self.mask()?;
        apply_mask(mask, logits);
        for (t, x) in ends {
            logits[t] = if accepting { x } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    /// `token` ends the choice (EOS or a stop token id) rather than being output.
    pub fn is_end_token(&self, token: u32) -> bool {
        self.end_tokens.contains(&token)
    }

    /// Takes a sampled token. `Ok(true)`: the choice is over (an end token, or the grammar
    /// is complete: nothing but its end may follow).
    pub fn consume(&mut self, token: u32) -> Result<bool, String> {
        self.mask = None;
        if self.end_tokens.contains(&token) {
            return Ok(true);
        }
        if token as usize >= self.vocab {
            return Err(format!(
                "token {token} is outside the constraint's vocabulary"
            ));
        }
        if let Err(e) = self.matcher.consume_token(token) {
            return Err(failure_text(&self.matcher, &e));
        }
        Ok(self.matcher.is_stopped())
    }
}

/// `-inf` for every logit whose bit is clear in `mask` (32 tokens a word; whole words of
/// allowed or disallowed tokens at once), and for every id beyond the mask.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let word = words.get(w).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        if word == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (bit, x) in chunk.iter_mut().enumerate() {
            if word & (1 << bit) == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// What a client is told when its constraint fails mid-generation: the limit it ran into, in
/// words, rather than the grammar engine's internal state names.
fn failure_text(matcher: &Matcher, e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    // After an error the matcher's reason is `InternalError`; its message names the cause.
    let reason = match matcher.stop_reason() {
        StopReason::InternalError if text.starts_with("NoExtension") => StopReason::NoExtension,
        StopReason::InternalError if text.starts_with("LexerTooComplex") => {
            StopReason::LexerTooComplex
        }
        StopReason::InternalError if text.starts_with("ParserTooComplex") => {
            StopReason::ParserTooComplex
        }
        other => other,
    };
    match reason {
        StopReason::NoExtension | StopReason::NoExtensionBias => {
            "the output constraint allows no further output here".to_string()
        }
        StopReason::LexerTooComplex => format!(
            "the output constraint is too complex to follow: one token needs more than {} units of lexer work (the limit)",
            LIMITS.step_lexer_fuel
        ),
        StopReason::ParserTooComplex => format!(
            "the output constraint is too complex to follow: one token needs more than {} parser items (the limit)",
            LIMITS.step_max_items
        ),
        _ => format!("the output constraint failed: {text}"),
    }
}

/// The token environment of `tokenizer`: every token's bytes (special tokens marked as
/// llguidance expects) in a trie, EOS as the tokenizer names it. Text is tokenized
/// greedily over the trie where llguidance needs it (forced tokens, which the engine does
/// not use).
fn token_env(tokenizer: &Tokenizer) -> Result<TokEnv, ConstraintError> {
    let json = tokenizer
        .to_tokenizer_json()
        .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
    // llguidance asserts on vocabularies it does not expect; a panic there is an error here.
    let words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&value))
        .map_err(|_| ConstraintError::Tokenizer("unexpected vocabulary".into()))?
        .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
    let vocab = words.len().max(tokenizer.vocab_size());
    let mut words = words;
    words.resize(vocab, Vec::new());
    let eos: Vec<u32> = tokenizer
        .eos_ids()
        .iter()
        .copied()
        .filter(|&t| (t as usize) < vocab)
        .collect();
    let vocab_u32 = u32::try_from(vocab)
        .map_err(|_| ConstraintError::Tokenizer(format!("vocabulary of {vocab} tokens")))?;
    let info = TokRxInfo::new(
        vocab_u32,
        eos.first()
            .copied()
            .unwrap_or(llguidance::toktrie::INVALID_TOKEN),
    );
    let mut trie = TokTrie::from(&info, &words);
    if !eos.is_empty() {
        trie = trie.with_eos_tokens(&eos);
    }
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

fn factory(tokenizer: &Tokenizer) -> Result<ParserFactory, ConstraintError> {
    let env = token_env(tokenizer)?;
    let mut factory =
        ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
    factory.quiet();
    *factory.limits_mut() = LIMITS.clone();
    Ok(factory)
}

fn compile_with(
    factory: &ParserFactory,
    spec: &ConstraintSpec,
) -> Result<CompiledConstraint, ConstraintError> {
    check_size(spec)?;
    check_depth(spec)?;
    let (what, grammar) = grammar(spec)?;
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| ConstraintError::Invalid(format!("invalid {what}: {e}")))?;
    let mut matcher = Matcher::new(Ok(parser));
    if let Some(e) = matcher.get_error() {
        return Err(ConstraintError::Invalid(format!("invalid {what}: {e}")));
    }
    let nothing = || {
        ConstraintError::Invalid(format!(
            "invalid {what}: it matches no output at all (for example a $ref or rule that only refers to itself)"
        ))
    };
    let first_mask = match matcher.compute_mask() {
        Ok(mask) if !mask.is_zero() => mask,
        Ok(_) => return Err(nothing()),
        Err(e) => {
            let text = failure_text(&matcher, &e);
            return Err(if text.contains("allows no further output") {
                nothing()
            } else {
                ConstraintError::Invalid(format!("invalid {what}: {text}"))
            });
        }
    };
    Ok(CompiledConstraint {
        matcher,
        first_mask,
        vocab: factory.tok_env().tok_trie().vocab_size(),
    })
}

/// The nesting limits of [`crate::constraint_depth`] (checked before llguidance recurses).
fn check_depth(spec: &ConstraintSpec) -> Result<(), ConstraintError> {
    let checked = match spec {
        ConstraintSpec::JsonObject | ConstraintSpec::Choice(_) => Ok(()),
        ConstraintSpec::JsonSchema(schema) => constraint_depth::check_schema(schema),
        ConstraintSpec::Regex(rx) => constraint_depth::check_regex(rx),
        ConstraintSpec::Lark(g) => constraint_depth::check_lark(g),
    };
    checked.map_err(|constraint_depth::TooDeep(m)| ConstraintError::TooLarge(m))
}

fn check_size(spec: &ConstraintSpec) -> Result<(), ConstraintError> {
    let (what, bytes) = match spec {
        ConstraintSpec::JsonObject => return Ok(()),
        ConstraintSpec::JsonSchema(v) => ("JSON schema", v.to_string().len()),
        ConstraintSpec::Regex(r) => ("regex", r.len()),
        ConstraintSpec::Lark(g) => ("grammar", g.len()),
        ConstraintSpec::Choice(c) => {
            if c.len() > MAX_CHOICES {
                return Err(ConstraintError::TooLarge(format!(
                    "{} choices, more than the limit of {MAX_CHOICES}",
                    c.len()
                )));
            }
            ("choices", c.iter().map(String::len).sum())
        }
    };
    if bytes > MAX_SPEC_BYTES {
        return Err(ConstraintError::TooLarge(format!(
            "the {what} is {bytes} bytes, more than the limit of {MAX_SPEC_BYTES}"
        )));
    }
    Ok(())
}

/// The JSON formatting a schema constraint produces unless the schema sets its own
/// (`x-guidance`): compact with one space after `,` and `:` (as `json.dumps`), no free
/// whitespace, so a model cannot pad its output with whitespace without end.
fn json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// `spec` as an llguidance grammar, and what to call it in errors.
fn grammar(spec: &ConstraintSpec) -> Result<(&'static str, TopLevelGrammar), ConstraintError> {
    Ok(match spec {
        ConstraintSpec::JsonObject => (
            "JSON schema",
            TopLevelGrammar::from_json_schema(serde_json::json!({
                "type": "object",
                "x-guidance": json_options(),
            })),
        ),
        ConstraintSpec::JsonSchema(schema) => {
            let mut schema = schema.clone();
            crate::close_objects(&mut schema);
            match &mut schema {
                serde_json::Value::Object(map) => {
                    map.entry("x-guidance").or_insert_with(json_options);
                }
                serde_json::Value::Bool(_) => {}
                other => {
                    return Err(ConstraintError::Invalid(format!(
                        "invalid JSON schema: a schema is an object or a boolean, not {other}"
                    )))
                }
            }
            ("JSON schema", TopLevelGrammar::from_json_schema(schema))
        }
        ConstraintSpec::Regex(rx) => {
            // llguidance rewrites the regex into its Lark dialect first; check it as a regex
            // here so the error speaks of the regex the client sent.
            if let Err(e) = llguidance::derivre::RegexBuilder::new().mk_regex(rx) {
                return Err(ConstraintError::Invalid(format!("invalid regex: {e}")));
            }
            ("regex", TopLevelGrammar::from_regex(rx))
        }
        ConstraintSpec::Choice(choices) => {
            if choices.is_empty() {
                return Err(ConstraintError::Invalid(
                    "invalid choice: the list of choices is empty".into(),
                ));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| lark_literal(c)).collect();
            (
                "choice",
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | "))),
            )
        }
        ConstraintSpec::Lark(g) => ("Lark grammar", TopLevelGrammar::from_lark(g.clone())),
    })
}

/// `s` as a Lark string literal (a JSON string: llguidance reads Lark strings with JSON's
/// escapes); the empty string as an empty regex.
fn lark_literal(s: &str) -> String {
    if s.is_empty() {
        return "/()/".to_string();
    }
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words_env() -> TokEnv {
        Arc::new(ApproximateTokEnv::single_byte())
    }

    #[test]
    fn apply_mask_clears_disallowed_and_tail() {
        let mut mask = SimpleVob::alloc(40);
        mask.allow_token(1);
        mask.allow_token(33);
        let mut logits = vec![0.5f32; 70];
        apply_mask(&mask, &mut logits);
        for (i, &x) in logits.iter().enumerate() {
            assert_eq!(x == 0.5, i == 1 || i == 33, "token {i}");
        }
    }

    #[test]
    fn size_limits_are_errors() {
        let long = ConstraintSpec::Regex("a".repeat(MAX_SPEC_BYTES + 1));
        assert!(matches!(
            check_size(&long),
            Err(ConstraintError::TooLarge(_))
        ));
        let many = ConstraintSpec::Choice(vec!["x".into(); MAX_CHOICES + 1]);
        assert!(matches!(
            check_size(&many),
            Err(ConstraintError::TooLarge(_))
        ));
    }

    #[test]
    fn specs_compile_on_a_byte_vocabulary() {
        let mut f = ParserFactory::new_simple(&words_env()).expect("factory");
        f.quiet();
        *f.limits_mut() = LIMITS.clone();
        for spec in [
            ConstraintSpec::JsonObject,
            ConstraintSpec::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/n"}},
                "required": ["a"],
                "$defs": {"n": {"type": "integer"}}
            })),
            ConstraintSpec::Regex(r"\d{3}-[a-z]+".into()),
            ConstraintSpec::Choice(vec!["yes".into(), "say \"no\"\n".into(), String::new()]),
            ConstraintSpec::Lark("start: \"<a>\" json\njson: %json {\"type\": \"integer\"}".into()),
        ] {
            compile_with(&f, &spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        }
        for (spec, words) in [
            (
                ConstraintSpec::JsonSchema(serde_json::json!({"type": "nope"})),
                "JSON schema",
            ),
            (
                ConstraintSpec::JsonSchema(serde_json::json!(3)),
                "JSON schema",
            ),
            (ConstraintSpec::Regex("(ab".into()), "regex"),
            (ConstraintSpec::Lark("start: foo".into()), "Lark grammar"),
            (ConstraintSpec::Choice(vec![]), "choice"),
        ] {
            let e = compile_with(&f, &spec)
                .expect_err("should not compile")
                .to_string();
            assert!(e.contains(words), "{spec:?}: {e}");
        }
    }

    fn byte_factory() -> ParserFactory {
        let mut f = ParserFactory::new_simple(&words_env()).expect("factory");
        f.quiet();
        *f.limits_mut() = LIMITS.clone();
        f
    }

    #[test]
    fn self_reference_matches_nothing_and_is_refused_when_compiled() {
        let f = byte_factory();
        for schema in [
            serde_json::json!({"$ref": "#"}),
            serde_json::json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        ] {
            let e = compile_with(&f, &ConstraintSpec::JsonSchema(schema.clone()))
                .expect_err("matches nothing");
            assert!(
                matches!(&e, ConstraintError::Invalid(m) if m.contains("matches no output")),
                "{schema}: {e}"
            );
        }
        let e = compile_with(&f, &ConstraintSpec::Lark("start: start".into()))
            .expect_err("matches nothing");
        assert!(!e.to_string().contains("NoExtension"), "{e}");
    }

    #[test]
    fn chains_past_the_depth_limit_are_too_large_not_a_crash() {
        let f = byte_factory();
        let lark = ConstraintSpec::Lark(crate::constraint_depth::test_specs::lark_chain(800));
        let schema =
            ConstraintSpec::JsonSchema(crate::constraint_depth::test_specs::ref_chain(1000));
        for spec in [lark, schema] {
            // On a 2 MiB stack, as an async worker has: refused before llguidance recurses.
            let r = run_isolated("test", 2 << 20, || compile_with(&f, &spec).map(|_| ()));
            assert!(
                matches!(&r, Ok(Err(ConstraintError::TooLarge(m))) if m.contains("limit of")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn the_deepest_allowed_specs_compile_in_a_quarter_of_the_deep_stack() {
        use crate::constraint_depth::{MAX_GRAMMAR_DEPTH, MAX_SCHEMA_DEPTH};
        let f = byte_factory();
        let specs = [
            ConstraintSpec::Lark(crate::constraint_depth::test_specs::lark_chain(
                MAX_GRAMMAR_DEPTH - 1,
            )),
            ConstraintSpec::JsonSchema(crate::constraint_depth::test_specs::ref_chain(
                MAX_SCHEMA_DEPTH / 3 - 2,
            )),
            ConstraintSpec::Regex(format!(
                "{}a{}",
                "(".repeat(MAX_GRAMMAR_DEPTH),
                ")".repeat(MAX_GRAMMAR_DEPTH)
            )),
        ];
        for spec in specs {
            let r = run_isolated("test", DEEP_STACK_BYTES / 4, || {
                compile_with(&f, &spec).map(|_| ())
            });
            assert!(matches!(r, Ok(Ok(()))), "{r:?}");
        }
        // Lark brackets at the limit: llguidance refuses them itself (its parser stops at a
        // smaller depth), which is an error for the client, not a crash.
        let brackets = ConstraintSpec::Lark(format!(
            "start: {}\"a\"{}",
            "(".repeat(MAX_GRAMMAR_DEPTH),
            ")".repeat(MAX_GRAMMAR_DEPTH)
        ));
        let r = run_isolated("test", DEEP_STACK_BYTES / 4, || {
            compile_with(&f, &brackets).map(|_| ())
        });
        assert!(
            matches!(&r, Ok(Err(ConstraintError::Invalid(m))) if m.contains("nested")),
            "{r:?}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// What the fuzz target does, on random text as each kind of spec.
        #[test]
        fn any_text_as_a_spec_is_an_error_or_a_walk(
            text in "[ -~\\n]{0,200}",
            steer in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            exercise_untrusted_constraint(&ConstraintSpec::Regex(text.clone()), &steer);
            exercise_untrusted_constraint(&ConstraintSpec::Lark(text.clone()), &steer);
            exercise_untrusted_constraint(
                &ConstraintSpec::Choice(text.lines().map(str::to_string).collect()),
                &steer,
            );
            if let Ok(schema) = serde_json::from_str(&text) {
                exercise_untrusted_constraint(&ConstraintSpec::JsonSchema(schema), &steer);
            }
        }
    }

    #[test]
    fn choice_matcher_walks_to_the_end() {
        let mut f = ParserFactory::new_simple(&words_env()).expect("factory");
        f.quiet();
        let spec = ConstraintSpec::Choice(vec!["ab".into(), "ac".into()]);
        let compiled = compile_with(&f, &spec).expect("compiles");
        let eos = f.tok_env().tok_trie().eos_token();
        let mut c = compiled.for_choice(&[eos]);
        let mask = c.mask().expect("mask").clone();
        assert!(mask.is_allowed(u32::from(b'a')));
        assert!(!mask.is_allowed(u32::from(b'b')));
        assert!(!c.consume(u32::from(b'a')).expect("a"));
        let mut row = vec![0.0f32; f.tok_env().tok_trie().vocab_size()];
        c.apply(&mut row).expect("apply");
        assert!(row[usize::from(b'b')] == 0.0 && row[usize::from(b'c')] == 0.0);
        assert!(
            row[eos as usize] == f32::NEG_INFINITY,
            "EOS only where accepting"
        );
        assert!(c.consume(u32::from(b'c')).expect("c"), "complete after ac");
    }
}
