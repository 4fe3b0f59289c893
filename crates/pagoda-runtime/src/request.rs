//! From request knobs to an [`EngineRequest`]: the knobs every front end may set
//! ([`Knobs`]), checked and applied over a base [`SamplingParams`], with the length rules and
//! the operator's limits ([`Bounds`]). The server maps [`RequestError`] to a 400 naming the
//! parameter; `pagoda batch` writes the same error into its output line.
//!
//! Invariants: nothing out of range reaches the engine (each error names its parameter);
//! a prompt that does not fit the context is refused, never truncated; with
//! [`LengthRule::Strict`] (OpenAI, as vLLM) `prompt + max_tokens` over the context, or
//! `max_tokens` over the operator's ceiling, is an error, with [`LengthRule::Clamp`] (Ollama)
//! generation just ends there. A request that names no `max_tokens` gets the smaller of the
//! ceiling and the context left, and the engine is told the number was not the client's
//! (`max_tokens_explicit`), so shortest-job-first ranks it by its running estimate instead.

use pagoda_engine::{ConstraintSpec, EngineError, EngineRequest, SamplingParams};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;

/// The range a request's `priority` may take (vLLM's meaning: lower runs earlier).
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -1_000_000..=1_000_000;

/// A request the runtime refuses: what is wrong, the parameter at fault and an OpenAI error
/// `code` where one applies. Always the client's fault (a 400 over HTTP).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub message: String,
    /// The field at fault: a static name, or one built from the request (an unknown field,
    /// `options.mirostat`, `response_format.json_schema.name`).
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl RequestError {
    /// An error about the request as a whole.
    pub fn invalid(message: impl Into<String>) -> Self {
        RequestError {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// An error naming the parameter at fault.
    pub fn param(param: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        RequestError {
            param: Some(param.into()),
            ..Self::invalid(message)
        }
    }

    /// The parameter at fault, if any.
    pub fn param_name(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// The same error with an OpenAI error `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl From<pagoda_engine::sampling::SamplingError> for RequestError {
    fn from(e: pagoda_engine::sampling::SamplingError) -> Self {
        let message = EngineError::from(e.clone()).to_string();
        match e {
            pagoda_engine::sampling::SamplingError::InvalidParameter { name, .. } => {
                RequestError::param(name, message)
            }
        }
    }
}

/// Generation parameters any front end may set; `None` keeps the base value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Knobs {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `0` or `-1`: off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `-1`: the whole context.
    pub repeat_last_n: Option<i64>,
    pub seed: Option<u64>,
    pub logprobs: Option<usize>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub stop: Vec<String>,
    pub max_tokens: Option<usize>,
    /// The request field `max_tokens` came from, which its errors name.
    pub max_tokens_field: LengthField,
    pub n: usize,
    pub ignore_eos: bool,
    /// Turn speculative decoding off for this request (it is on when the engine has it).
    pub no_speculation: bool,
    /// vLLM's `priority`: lower runs earlier under `--policy priority`; `None` is 0.
    pub priority: Option<i64>,
    /// What the output must match: structured output (`response_format`, vLLM's `guided_*` /
    /// `structured_outputs`, Ollama's `format`; see [`crate::structured`]) or a forced tool
    /// call (see [`crate::tools`]).
    pub constraint: Option<ConstraintSpec>,
}

/// The field a request's output length came from: OpenAI's `max_tokens` (or
/// `max_completion_tokens`), or Ollama's `options.num_predict` (where `-1` means no limit, so
/// it arrives as no `max_tokens` at all, and `0` is refused in Ollama's words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LengthField {
    #[default]
    MaxTokens,
    NumPredict,
}

/// What happens when `prompt + max_tokens` exceeds the context or the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthRule {
    Strict,
    Clamp,
}

/// What the model and the operator allow a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Tokens one sequence may hold (prompt + output): the engine's `max_model_len`, or less
    /// when the model's Modelfile says so.
    pub context: usize,
    pub vocab_size: usize,
    pub rule: LengthRule,
    /// The operator's ceiling on output tokens per choice (`--max-tokens-limit`).
    pub max_tokens_limit: Option<usize>,
    /// Whether the engine schedules by priority; a non-zero `priority` is refused otherwise
    /// (as vLLM does), rather than accepted and ignored.
    pub priority_scheduling: bool,
}

impl Bounds {
    /// The bounds of a serving engine: the context its `max_model_len` (and the model's
    /// Modelfile) allow, the operator's output ceiling, and priority requests accepted only
    /// under [`Policy::Priority`](pagoda_engine::Policy::Priority). The length rule is the
    /// API shape's, which its plan builder sets ([`with_rule`](Self::with_rule)); strict
    /// until then.
    pub fn serving(
        loaded: &crate::loader::LoadedModel,
        max_model_len: usize,
        max_tokens_limit: Option<usize>,
        policy: pagoda_engine::Policy,
    ) -> Self {
        Bounds {
            context: loaded.context_window(max_model_len),
            vocab_size: loaded.tokenizer.vocab_size(),
            rule: LengthRule::Strict,
            max_tokens_limit,
            priority_scheduling: policy == pagoda_engine::Policy::Priority,
        }
    }
}

impl Bounds {
    /// The same bounds under `rule`.
    pub fn with_rule(self, rule: LengthRule) -> Self {
        Bounds { rule, ..self }
    }

    /// What `engine` itself allows, for the CLI's measuring tools (`bench`, `eval`), which
    /// run a model at its engine's limits, not a Modelfile's: its context, its vocabulary,
    /// generation ending at the context rather than refusing, no output ceiling, no
    /// priorities.
    pub fn engine(engine: &pagoda_engine::EngineHandle) -> Self {
        Bounds {
            context: engine.layout().max_model_len,
            vocab_size: engine.tokenizer().vocab_size(),
            rule: LengthRule::Clamp,
            max_tokens_limit: None,
            priority_scheduling: false,
        }
    }
}

/// Builds the engine request for `prompt` (already templated and tokenized): the one place
/// the ranges of `max_tokens`, the prompt's length, `priority`, `stop` and the sampling knobs
/// are checked (the sampling ranges through the engine's
/// [`SamplingParams::validate`](pagoda_engine::SamplingParams::validate)). Front ends reach
/// it through a [`Plan`](crate::plan::Plan) builder.
pub fn engine_request(
    prompt: Vec<u32>,
    base: &SamplingParams,
    knobs: Knobs,
    bounds: &Bounds,
) -> Result<EngineRequest, RequestError> {
    let context = bounds.context;
    if knobs.max_tokens == Some(0) && knobs.max_tokens_field == LengthField::NumPredict {
        return Err(RequestError::param(
            "options.num_predict",
            "num_predict must be positive (or -1 for no limit)",
        ));
    }
    if prompt.is_empty() {
        return Err(RequestError::invalid("the prompt is empty"));
    }
    if prompt.len() >= context {
        return Err(RequestError::invalid(format!(
            "this model's maximum context length is {context} tokens, but the prompt has {} tokens; shorten it",
            prompt.len()
        ))
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt.len();
    let ceiling = bounds.max_tokens_limit.unwrap_or(usize::MAX);
    let strict = bounds.rule == LengthRule::Strict;
    let max_tokens = match knobs.max_tokens {
        Some(0) => {
            return Err(RequestError::param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) if m > ceiling && strict => {
            return Err(RequestError::param(
                "max_tokens",
                format!(
                    "max_tokens is {m}, but this server allows at most {ceiling} output tokens per request; lower max_tokens"
                ),
            ))
        }
        Some(m) if m > room && strict => {
            return Err(RequestError::param(
                "max_tokens",
                format!(
                    "this model's maximum context length is {context} tokens, but {} were requested ({} in the prompt, {m} for the completion); lower max_tokens or shorten the prompt",
                    prompt.len().saturating_add(m),
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Some(m) => m.min(room).min(ceiling),
        None => room.min(ceiling),
    };
    let priority = priority(knobs.priority, bounds.priority_scheduling)?;
    let sampling = sampling(base, &knobs, bounds.vocab_size)?;
    let stop = check_stops(knobs.stop)?;
    let mut req = EngineRequest::new(prompt, sampling, max_tokens);
    req.max_tokens_explicit = knobs.max_tokens.is_some();
    req.stop = stop;
    req.n = knobs.n;
    req.ignore_eos = knobs.ignore_eos;
    req.speculative = !knobs.no_speculation;
    req.priority = priority;
    req.constraint = knobs.constraint;
    Ok(req)
}

/// The engine's priority (higher first) for vLLM's (lower first).
fn priority(requested: Option<i64>, scheduling: bool) -> Result<i32, RequestError> {
    let p = requested.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&p) {
        return Err(RequestError::param(
            "priority",
            format!(
                "priority must be in [{}, {}], got {p}",
                PRIORITY_RANGE.start(),
                PRIORITY_RANGE.end()
            ),
        ));
    }
    if p != 0 && !scheduling {
        return Err(RequestError::param(
            "priority",
            "priority is only used when the server runs with --policy priority; send 0 or leave it out",
        ));
    }
    // In range, so the negation fits an i32.
    Ok(i32::try_from(-p).unwrap_or(0))
}

fn sampling(
    base: &SamplingParams,
    k: &Knobs,
    vocab_size: usize,
) -> Result<SamplingParams, RequestError> {
    let mut s = base.clone();
    match k.temperature {
        Some(t) => s.temperature = t,
        // Several choices of a model whose default is greedy would be copies of one answer:
        // a request for n > 1 that names no temperature samples at OpenAI's default, 1.
        None if k.n > 1 && s.temperature == 0.0 => s.temperature = 1.0,
        None => {}
    }
    if let Some(p) = k.top_p {
        s.top_p = p;
    }
    if let Some(top_k) = k.top_k {
        s.top_k = match top_k {
            -1 | 0 => 0,
            k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            k => {
                return Err(RequestError::param(
                    "top_k",
                    format!("top_k must be -1 (off) or positive, got {k}"),
                ))
            }
        };
    }
    if let Some(m) = k.min_p {
        s.min_p = m;
    }
    if let Some(v) = k.presence_penalty {
        s.presence_penalty = v;
    }
    if let Some(v) = k.frequency_penalty {
        s.frequency_penalty = v;
    }
    if let Some(v) = k.repetition_penalty {
        s.repetition_penalty = v;
    }
    if let Some(n) = k.repeat_last_n {
        s.repeat_last_n = match n {
            -1 => pagoda_engine::sampling::REPEAT_WHOLE_CONTEXT,
            n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            n => {
                return Err(RequestError::param(
                    "repeat_last_n",
                    format!("repeat_last_n must be -1 (whole context) or >= 0, got {n}"),
                ))
            }
        };
    }
    s.seed = k.seed.or(s.seed);
    s.logprobs = k.logprobs;
    if let Some(bias) = &k.logit_bias {
        s.logit_bias = bias
            .iter()
            .map(|(id, &b)| {
                let token: u32 = id.trim().parse().map_err(|_| {
                    RequestError::param(
                        "logit_bias",
                        format!("logit_bias keys must be token ids, got `{id}`"),
                    )
                })?;
                if !(-100.0..=100.0).contains(&b) {
                    return Err(RequestError::param(
                        "logit_bias",
                        format!(
                            "logit_bias values must be in [-100, 100], got {b} for token {token}"
                        ),
                    ));
                }
                Ok((token, b))
            })
            .collect::<Result<_, _>>()?;
    }
    s.validate(vocab_size)?;
    Ok(s)
}

fn check_stops(stops: Vec<String>) -> Result<Vec<String>, RequestError> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(RequestError::param(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(RequestError::param(
            "stop",
            "stop strings must not be empty",
        ));
    }
    Ok(stops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Knobs {
        Knobs {
            n: 1,
            ..Knobs::default()
        }
    }

    fn bounds(rule: LengthRule) -> Bounds {
        Bounds {
            context: 100,
            vocab_size: 1000,
            rule,
            max_tokens_limit: None,
            priority_scheduling: false,
        }
    }

    fn build(prompt_len: usize, k: Knobs, rule: LengthRule) -> Result<EngineRequest, RequestError> {
        engine_request(
            vec![1; prompt_len],
            &SamplingParams::default(),
            k,
            &bounds(rule),
        )
    }

    #[test]
    fn max_tokens_defaults_to_the_room_left_and_strict_refuses_overflow() {
        assert_eq!(
            build(10, knobs(), LengthRule::Strict)
                .expect("ok")
                .max_tokens,
            90
        );
        let over = Knobs {
            max_tokens: Some(91),
            ..knobs()
        };
        let e = build(10, over.clone(), LengthRule::Strict).expect_err("over the context");
        assert_eq!(e.param_name(), Some("max_tokens"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(
            build(10, over, LengthRule::Clamp).expect("ok").max_tokens,
            90
        );
        let zero = Knobs {
            max_tokens: Some(0),
            ..knobs()
        };
        assert!(build(10, zero, LengthRule::Clamp).is_err());
    }

    #[test]
    fn prompts_that_fill_the_context_are_refused_not_truncated() {
        let e = build(100, knobs(), LengthRule::Clamp).expect_err("too long");
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(build(0, knobs(), LengthRule::Clamp).is_err());
    }

    #[test]
    fn bad_knobs_name_their_parameter() {
        let cases = [
            Knobs {
                top_p: Some(1.5),
                ..knobs()
            },
            Knobs {
                top_k: Some(-5),
                ..knobs()
            },
            Knobs {
                presence_penalty: Some(3.0),
                ..knobs()
            },
            Knobs {
                logit_bias: Some([("x".to_string(), 1.0)].into()),
                ..knobs()
            },
            Knobs {
                logit_bias: Some([("5000".to_string(), 1.0)].into()),
                ..knobs()
            },
            Knobs {
                logit_bias: Some([("5".to_string(), 500.0)].into()),
                ..knobs()
            },
            Knobs {
                stop: vec![String::new()],
                ..knobs()
            },
            Knobs {
                temperature: Some(f32::NAN),
                ..knobs()
            },
        ];
        let params = [
            "top_p",
            "top_k",
            "presence_penalty",
            "logit_bias",
            "logit_bias",
            "logit_bias",
            "stop",
            "temperature",
        ];
        for (k, want) in cases.into_iter().zip(params) {
            let e = build(5, k, LengthRule::Strict).expect_err(want);
            assert_eq!(e.param_name(), Some(want), "{e}");
        }
    }

    #[test]
    fn several_choices_of_a_greedy_default_sample_unless_told_otherwise() {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let r = |n: usize, temperature: Option<f32>| {
            engine_request(
                vec![1; 5],
                &greedy,
                Knobs {
                    n,
                    temperature,
                    ..Knobs::default()
                },
                &bounds(LengthRule::Strict),
            )
            .expect("valid")
            .sampling
            .temperature
        };
        assert_eq!(r(1, None), 0.0);
        assert_eq!(r(4, None), 1.0);
        assert_eq!(r(4, Some(0.0)), 0.0);
        assert_eq!(r(4, Some(0.3)), 0.3);
    }

    #[test]
    fn knobs_override_the_base() {
        let k = Knobs {
            temperature: Some(0.0),
            top_k: Some(-1),
            seed: Some(7),
            logit_bias: Some([("3".to_string(), -100.0)].into()),
            stop: vec!["\n".into()],
            n: 2,
            ..knobs()
        };
        let r = build(5, k, LengthRule::Strict).expect("ok");
        assert_eq!(
            r.sampling.temperature, 0.0,
            "an explicit 0 is kept for n > 1"
        );
        assert_eq!(r.sampling.top_k, 0);
        assert_eq!(r.sampling.seed, Some(7));
        assert_eq!(r.sampling.logit_bias, vec![(3, -100.0)]);
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert_eq!(r.n, 2);
    }

    #[test]
    fn the_ceiling_bounds_defaults_and_refuses_or_clamps_explicit_values() {
        let limited = |rule| Bounds {
            max_tokens_limit: Some(20),
            ..bounds(rule)
        };
        let req = |k: Knobs, rule| {
            engine_request(vec![1; 10], &SamplingParams::default(), k, &limited(rule))
        };
        let default = req(knobs(), LengthRule::Strict).expect("ok");
        assert_eq!(default.max_tokens, 20, "the ceiling, not the 90 left");
        assert!(!default.max_tokens_explicit);
        let asked = Knobs {
            max_tokens: Some(21),
            ..knobs()
        };
        let e = req(asked.clone(), LengthRule::Strict).expect_err("over the ceiling");
        assert_eq!(e.param_name(), Some("max_tokens"));
        assert!(e.message.contains("at most 20"), "{e}");
        let clamped = req(asked, LengthRule::Clamp).expect("clamped");
        assert_eq!(clamped.max_tokens, 20);
        assert!(clamped.max_tokens_explicit);
        // Near the end of the context the room left is the smaller bound.
        let near_end = engine_request(
            vec![1; 90],
            &SamplingParams::default(),
            knobs(),
            &limited(LengthRule::Strict),
        )
        .expect("ok");
        assert_eq!(near_end.max_tokens, 10);
    }

    #[test]
    fn priority_follows_vllm_lower_first_and_is_refused_when_unused_or_out_of_range() {
        let with = |p: i64, scheduling: bool| {
            engine_request(
                vec![1; 5],
                &SamplingParams::default(),
                Knobs {
                    priority: Some(p),
                    ..knobs()
                },
                &Bounds {
                    priority_scheduling: scheduling,
                    ..bounds(LengthRule::Strict)
                },
            )
        };
        // The engine runs higher first; vLLM's clients send lower-first.
        assert_eq!(with(-3, true).expect("ok").priority, 3);
        assert_eq!(with(7, true).expect("ok").priority, -7);
        assert_eq!(with(0, false).expect("0 is always fine").priority, 0);
        let unused = with(1, false).expect_err("no priority scheduling");
        assert_eq!(unused.param_name(), Some("priority"));
        assert!(unused.message.contains("--policy priority"), "{unused}");
        for bad in [i64::MAX, i64::MIN, 1_000_001] {
            assert_eq!(
                with(bad, true).expect_err("range").param_name(),
                Some("priority")
            );
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn float() -> impl Strategy<Value = Option<f32>> {
            // Mostly absent, so that many requests get through and their bounds are checked.
            prop_oneof![
                6 => Just(None),
                1 => Just(Some(f32::NAN)),
                1 => Just(Some(f32::INFINITY)),
                2 => (-5.0f32..5.0).prop_map(Some),
            ]
        }

        fn any_knobs() -> impl Strategy<Value = Knobs> {
            (
                (float(), float(), float(), float(), float(), float()),
                (
                    proptest::option::of(-3i64..100_000),
                    proptest::option::of(-3i64..10),
                    proptest::option::of(0usize..400),
                    prop_oneof![3 => Just(None), 1 => any::<i64>().prop_map(Some), 1 => (-3i64..3).prop_map(Some)],
                    1usize..4,
                    proptest::collection::vec(".{0,3}", 0..20),
                ),
            )
                .prop_map(|((t, p, m, pp, fp, rp), (k, last, max, prio, n, stop))| {
                    Knobs {
                        temperature: t,
                        top_p: p,
                        min_p: m,
                        presence_penalty: pp,
                        frequency_penalty: fp,
                        repetition_penalty: rp,
                        top_k: k,
                        repeat_last_n: last,
                        max_tokens: max,
                        priority: prio,
                        n,
                        stop,
                        ..Knobs::default()
                    }
                })
        }

        proptest! {
            /// Whatever a client sends, the answer is an engine request the engine accepts
            /// and that respects every bound, or an error naming a knob — never a panic.
            #[test]
            fn every_request_is_valid_or_refused_by_name(
                knobs in any_knobs(),
                prompt_len in 0usize..120,
                limit in proptest::option::of(1usize..50),
                strict in any::<bool>(),
                scheduling in any::<bool>(),
            ) {
                let bounds = Bounds {
                    context: 100,
                    vocab_size: 1000,
                    rule: if strict { LengthRule::Strict } else { LengthRule::Clamp },
                    max_tokens_limit: limit,
                    priority_scheduling: scheduling,
                };
                match engine_request(vec![1; prompt_len], &SamplingParams::default(), knobs.clone(), &bounds) {
                    Ok(req) => {
                        prop_assert!(req.sampling.validate(1000).is_ok());
                        prop_assert!(req.max_tokens >= 1);
                        prop_assert!(req.prompt.len() + req.max_tokens <= 100);
                        prop_assert!(req.max_tokens <= limit.unwrap_or(usize::MAX));
                        prop_assert!(req.stop.len() <= MAX_STOP_STRINGS);
                        prop_assert_eq!(req.max_tokens_explicit, knobs.max_tokens.is_some());
                        if !scheduling {
                            prop_assert_eq!(req.priority, 0);
                        }
                    }
                    Err(e) => {
                        let whole = e.param.is_none()
                            && (prompt_len == 0 || prompt_len >= 100);
                        prop_assert!(whole || e.param.is_some(), "{e:?}");
                        prop_assert!(!e.message.is_empty());
                    }
                }
            }
        }
    }
}
