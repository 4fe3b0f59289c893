//! From API parameters to an [`EngineRequest`]: the knobs both APIs share ([`Knobs`]),
//! checked and applied over a base [`SamplingParams`], with the length rules.
//!
//! Invariants: nothing out of range reaches the engine (each error names its parameter);
//! a prompt that does not fit the context is refused, never truncated; with
//! [`LengthRule::Strict`] (OpenAI, as vLLM) `prompt + max_tokens` over the context is a 400,
//! with [`LengthRule::Clamp`] (Ollama) generation just ends at the context.

use crate::error::ApiError;
use pagoda_engine::{EngineRequest, SamplingParams};
use std::collections::BTreeMap;

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;

/// Generation parameters either API may set; `None` keeps the base value.
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
    pub n: usize,
    pub ignore_eos: bool,
    /// Turn speculative decoding off for this request (it is on when the engine has it).
    pub no_speculation: bool,
}

/// What happens when `prompt + max_tokens` exceeds the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthRule {
    Strict,
    Clamp,
}

/// Builds the engine request for `prompt` (already templated and tokenized).
pub fn engine_request(
    prompt: Vec<u32>,
    base: &SamplingParams,
    knobs: Knobs,
    context: usize,
    vocab_size: usize,
    rule: LengthRule,
) -> Result<EngineRequest, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty"));
    }
    if prompt.len() >= context {
        return Err(ApiError::invalid(format!(
            "this model's maximum context length is {context} tokens, but the prompt has {} tokens; shorten it",
            prompt.len()
        ))
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt.len();
    let max_tokens = match knobs.max_tokens {
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) if m > room && rule == LengthRule::Strict => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "this model's maximum context length is {context} tokens, but {} were requested ({} in the prompt, {m} for the completion); lower max_tokens or shorten the prompt",
                    prompt.len().saturating_add(m),
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Some(m) => m.min(room),
        None => room,
    };
    let sampling = sampling(base, &knobs, vocab_size)?;
    let stop = check_stops(knobs.stop)?;
    let mut req = EngineRequest::new(prompt, sampling, max_tokens);
    req.stop = stop;
    req.n = knobs.n;
    req.ignore_eos = knobs.ignore_eos;
    req.speculative = !knobs.no_speculation;
    Ok(req)
}

fn sampling(
    base: &SamplingParams,
    k: &Knobs,
    vocab_size: usize,
) -> Result<SamplingParams, ApiError> {
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
                return Err(ApiError::invalid_param(
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
                return Err(ApiError::invalid_param(
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
                    ApiError::invalid_param(
                        "logit_bias",
                        format!("logit_bias keys must be token ids, got `{id}`"),
                    )
                })?;
                if !(-100.0..=100.0).contains(&b) {
                    return Err(ApiError::invalid_param(
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
    s.validate(vocab_size)
        .map_err(|e| ApiError::from(pagoda_engine::EngineError::from(e)))?;
    Ok(s)
}

fn check_stops(stops: Vec<String>) -> Result<Vec<String>, ApiError> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
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

    fn build(prompt_len: usize, k: Knobs, rule: LengthRule) -> Result<EngineRequest, ApiError> {
        engine_request(
            vec![1; prompt_len],
            &SamplingParams::default(),
            k,
            100,
            1000,
            rule,
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
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
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
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
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
            assert_eq!(e.param.as_deref(), Some(want), "{e}");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
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
                100,
                1000,
                LengthRule::Strict,
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
}
