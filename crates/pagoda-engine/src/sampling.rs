//! Sampling: turns one row of raw logits into the next token id (plus optional logprobs).
//!
//! Owns [`SamplingParams`] (what a request asks for, and its validation), [`Sampler`] (one per
//! sequence: its seeded RNG and the reusable buffers that keep a step allocation-free) and the
//! small PRNG that makes "same seed => same text" hold across runs and platforms.
//!
//! # Order of operations
//!
//! This is the order users compare against (it follows llama.cpp's sampler chain and vLLM's
//! logits processors):
//!
//! 1. **Sanitize**: `NaN` becomes `-inf` and `+inf` becomes `f32::MAX`, so that every later
//!    step works on values in `[-inf, f32::MAX]`. The row is modified in place: after
//!    `sample` it holds the processed logits of steps 1-3. Sanitizing starts with a read-only
//!    count of the non-finite values (a healthy row has none and is not written):
//!    [`Sampler::try_sample`] (the engine's path) refuses a row where it finds any, with
//!    [`NonFiniteLogits`], and samples nothing, since a model's logits are never NaN or
//!    infinite unless its numbers broke; `sample` samples around them.
//! 2. **`logit_bias`**: `logit += bias` for each listed id (ids outside the row are skipped).
//!    A bias of `-inf` bans the token.
//! 3. **Penalties**, in this order:
//!    - `repetition_penalty` (HF / llama.cpp): for each *distinct* token among the last
//!      `repeat_last_n` tokens of `prompt ++ generated`, `logit > 0 ? logit / p : logit * p`.
//!    - `frequency_penalty` and `presence_penalty` (OpenAI): for each distinct token among
//!      `generated` (not the prompt) seen `c` times, `logit -= c * frequency + presence`.
//! 4. **Logprobs** (when `logprobs` is `Some(n)`): taken from `log_softmax` of the logits as
//!    they stand after steps 1-3, i.e. *before* temperature and truncation. This is vLLM's
//!    default ("processed logits, before temperature"): the numbers describe the model as
//!    biased and penalized, not the sampler's truncated distribution, so they stay comparable
//!    across temperatures and `top_k`/`top_p` settings.
//! 5. If every logit is now `-inf` (all banned, or a broken row), the argmax of the raw row
//!    (as sanitized in step 1: first index on ties, token 0 if every value was `NaN`/`-inf`)
//!    is returned, deterministically and without consuming randomness; its reported logprob
//!    is `0.0` (the fallback is a certain choice) and `top_logprobs` holds only that token.
//!    (Bias and penalties touch few entries; they are logged and undone to find it.)
//! 6. **Greedy** if `temperature == 0.0`: argmax, lowest id on ties. No randomness is consumed.
//! 7. **Temperature**: `weight = exp((logit - max) / T)` (in `f32`, with the crate's own
//!    `exp`; sums are accumulated in `f64`).
//! 8. **`top_k`**: keep the `k` largest logits (ties broken by lower id), by partial selection.
//! 9. **`top_p`**: over the top-k set, renormalized, keep the smallest prefix (by descending
//!    probability, ties by lower id) whose cumulative probability reaches `top_p` (with a
//!    `1e-6` tolerance, so that `0.5 + 0.3` reaches `0.8`).
//! 10. **`min_p`**: drop tokens whose probability is below `min_p` times the most likely
//!     token's. (Renormalizing does not change that ratio, so this is applied as a filter on the
//!     top-k set and intersected with the top-p prefix; the result is the same as applying it
//!     last.)
//! 11. **Sample** one token from the kept set, renormalized, with one `f64` draw in `[0, 1)`.
//!
//! # Invariants
//!
//! - `sample` never panics on any row (NaN, infinities, empty), any params (validated or not)
//!   or any token ids in `prompt`/`generated` (ids outside the row are ignored), and returns an
//!   id `< logits.len()` whenever the row is non-empty (token 0 for an empty row).
//! - Once the first step has sized the buffers, a step allocates nothing except the returned
//!   `top_logprobs`: candidates, weights, penalty counters and the undo log are buffers owned
//!   by the `Sampler`, and the counters are all zero between calls (asserted in debug builds).
//! - With `top_k <= 256` the top-k set is picked in one streaming pass; a larger `top_k` uses
//!   `select_nth_unstable` then sorts only the `k` kept. No step sorts the whole vocabulary
//!   unless `top_p` without `top_k` really needs most of it: that path sorts a selected head
//!   of 1024 candidates, then 4x larger slices, only as far as the cumulative sum walks.
//! - Determinism: the RNG is xoshiro256** seeded through SplitMix64 (both fully specified,
//!   integer-only), one draw per non-greedy step; candidates are ordered by a total order
//!   (logit descending, then id ascending) encoded as one `u64` key; weights come from a
//!   branch-free `exp` built from IEEE adds and multiplies, summed in a fixed order. Same seed
//!   and same logits give the same tokens on every platform and Rust version. (The one libm
//!   call on the sampling path, `ln(min_p)`, could move a token that sits exactly on the
//!   min-p threshold by one ulp; logprob values use libm `ln` too, which does not affect the
//!   choice.)

use rand::RngCore;

/// Largest `n` accepted for `logprobs` (the OpenAI limit).
pub const MAX_LOGPROBS: usize = 20;

/// `repeat_last_n` value meaning "the whole context" (llama.cpp's `-1`).
pub const REPEAT_WHOLE_CONTEXT: usize = usize::MAX;

/// Tolerance on the `top_p` cumulative sum, so that exact decimal sums reach their target.
const TOP_P_EPSILON: f64 = 1e-6;

/// Without `top_k`, `top_p` first sorts only this many best candidates.
const TOP_P_HEAD: usize = 1024;

/// What a request asks of the sampler. See the module docs for the order they apply in.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `0.0` => greedy (argmax). Default `0.8`.
    pub temperature: f32,
    /// `0` => off. Default `40`.
    pub top_k: usize,
    /// `1.0` => off. Default `0.95`.
    pub top_p: f32,
    /// `0.0` => off. Default `0.05`.
    pub min_p: f32,
    /// `1.0` => off. `logit > 0 ? logit / p : logit * p` over the distinct tokens of the
    /// penalty window.
    pub repetition_penalty: f32,
    /// How many trailing tokens of `prompt ++ generated` the repetition penalty looks at.
    /// Default `64`; `0` => none; [`REPEAT_WHOLE_CONTEXT`] => all of them.
    pub repeat_last_n: usize,
    /// OpenAI: subtracted once from every token that appeared in the generated text.
    pub presence_penalty: f32,
    /// OpenAI: `count * frequency_penalty` subtracted, count taken over the generated text.
    pub frequency_penalty: f32,
    /// `None` => a random seed from OS entropy (readable back with [`Sampler::seed`]).
    pub seed: Option<u64>,
    /// `None` => no logprobs; `Some(n)` => the chosen token's logprob and the top `n`
    /// alternatives (`n <= 20`).
    pub logprobs: Option<usize>,
    /// `(token id, bias)` added to the logits first; `-inf` bans the token.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Argmax decoding: temperature 0, every truncation and penalty off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logprobs: None,
            logit_bias: Vec::new(),
        }
    }

    /// Checks every parameter's range; the error names the first bad parameter.
    ///
    /// `top_k` larger than the vocabulary is accepted (it keeps everything), as is any
    /// `repeat_last_n`. `logit_bias` values may be finite or `-inf` (a ban).
    pub fn validate(&self, vocab_size: usize) -> Result<(), SamplingError> {
        fn bad(name: &'static str, message: String) -> Result<(), SamplingError> {
            Err(SamplingError::InvalidParameter { name, message })
        }
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", format!("must be finite and >= 0, got {t}"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return bad("top_p", format!("must be in (0, 1], got {p}"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return bad("min_p", format!("must be in [0, 1], got {m}"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad(
                "repetition_penalty",
                format!("must be finite and > 0, got {r}"),
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("must be in [-2, 2], got {v}"));
            }
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return bad(
                    "logprobs",
                    format!("must be at most {MAX_LOGPROBS}, got {n}"),
                );
            }
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab_size {
                return bad(
                    "logit_bias",
                    format!("token id {id} is out of range for a vocabulary of {vocab_size}"),
                );
            }
            if b.is_nan() || b == f32::INFINITY {
                return bad(
                    "logit_bias",
                    format!("bias for token {id} must be finite or -inf, got {b}"),
                );
            }
        }
        Ok(())
    }
}

/// A request's sampling parameters are out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("invalid sampling parameter `{name}`: {message}")]
    InvalidParameter { name: &'static str, message: String },
}

/// What the sanitize pass (module docs, step 1) found in a row of raw logits: how many values
/// were NaN, `+inf` and `-inf`. Raw logits never hold these unless the model's arithmetic
/// broke (broken weights, an unsupported quantization, an overflow), so
/// [`Sampler::try_sample`] refuses such a row with this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NonFiniteLogits {
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
    /// Values in the row.
    pub len: usize,
}

impl NonFiniteLogits {
    /// Whether any value was NaN or infinite.
    pub fn any(&self) -> bool {
        self.nan + self.pos_inf + self.neg_inf > 0
    }
}

impl std::fmt::Display for NonFiniteLogits {
    /// `NaN in 320 of 320 logits`, `NaN and +inf in 5 of 320 logits`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<&str> = [
            (self.nan, "NaN"),
            (self.pos_inf, "+inf"),
            (self.neg_inf, "-inf"),
        ]
        .into_iter()
        .filter(|&(n, _)| n > 0)
        .map(|(_, kind)| kind)
        .collect();
        let kinds = match kinds.as_slice() {
            [] => "no non-finite value".to_string(),
            [one] => (*one).to_string(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        };
        let count = self.nan + self.pos_inf + self.neg_inf;
        write!(f, "{kinds} in {count} of {} logits", self.len)
    }
}

/// One token and its log-probability (natural log, see the module docs for which
/// distribution).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
}

/// What one sampling step chose.
#[derive(Debug, Clone)]
pub struct SampledToken {
    pub token: u32,
    /// The chosen token's logprob; `Some` exactly when `logprobs` was requested.
    pub logprob: Option<f32>,
    /// The `n` most likely tokens, most likely first (ties: lower id first). May hold the
    /// chosen token or not; it has fewer than `n` entries only when fewer tokens have a
    /// finite logprob. Empty when logprobs were not requested.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// A candidate token as one sortable integer: ascending order of keys is descending logit,
/// then ascending id — a total order, so selection and sorting give the same result on every
/// platform and `std` version. The logit is looked up in the row by id.
fn key(id: usize, x: f32) -> u64 {
    // Map the float to a u32 whose ascending order is the float's, then invert for descending.
    let b = x.to_bits();
    let ord = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    (u64::from(!ord) << 32) | id as u64
}

fn key_id(key: u64) -> usize {
    (key & 0xffff_ffff) as usize
}

/// Samples tokens for one sequence. Holds the seeded RNG and reusable buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Xoshiro256StarStar,
    /// Candidate keys (see [`key`]) of the current step; capacity is kept between steps.
    keys: Vec<u64>,
    /// Unnormalized probabilities of the final candidates (or of the whole row).
    weights: Vec<f32>,
    /// Per-token counters for the penalties, indexed by token id. All zero between calls.
    counts: Vec<u32>,
    /// `(id, sanitized logit)` before bias/penalties touched it, to recover the raw argmax.
    undo: Vec<(u32, f32)>,
    /// Keys of the best `n` tokens for logprobs, sorted.
    top: Vec<u64>,
}

impl Sampler {
    /// Builds a sampler and seeds its RNG from `params.seed`, or from OS entropy if `None`.
    /// Does not validate `params`: call [`SamplingParams::validate`] first to reject bad
    /// requests (an invalid one still never makes `sample` panic).
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(entropy_seed);
        Self {
            params,
            seed,
            rng: Xoshiro256StarStar::seed_from_u64(seed),
            keys: Vec::new(),
            weights: Vec::new(),
            counts: Vec::new(),
            undo: Vec::new(),
            top: Vec::new(),
        }
    }

    /// The seed in use (the drawn one when `params.seed` was `None`), to report or replay.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one row of `vocab_size` raw logits, which is modified in place
    /// (sanitized, then bias and penalties applied). `prompt` holds the prompt's token ids
    /// and `generated` the ids sampled so far: the repetition penalty looks at the last
    /// `repeat_last_n` of `prompt ++ generated`, presence/frequency at `generated` only.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> SampledToken {
        if logits.is_empty() {
            return self.empty_row();
        }
        sanitize(logits);
        self.sample_sanitized(logits, prompt, generated)
    }

    /// [`sample`](Self::sample), but a row holding any NaN or infinity is refused: `Err`
    /// says what was found, nothing is sampled and no randomness is consumed (the row is left
    /// sanitized). The check is the count the sanitize pass keeps anyway, so a finite row
    /// costs what `sample` costs.
    pub fn try_sample(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<SampledToken, NonFiniteLogits> {
        self.try_sample_masked(logits, prompt, generated, |_| {})
    }

    /// [`try_sample`](Self::try_sample) with `mask` applied to the checked row before
    /// anything else (bias, penalties, temperature, truncation): the constraint's token mask,
    /// setting disallowed logits to `-inf` (which the finiteness check must not see).
    pub fn try_sample_masked(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
        mask: impl FnOnce(&mut [f32]),
    ) -> Result<SampledToken, NonFiniteLogits> {
        if logits.is_empty() {
            return Ok(self.empty_row());
        }
        let found = sanitize(logits);
        if found.any() {
            return Err(found);
        }
        mask(logits);
        Ok(self.sample_sanitized(logits, prompt, generated))
    }

    /// What a step returns for an empty row: token 0.
    fn empty_row(&self) -> SampledToken {
        SampledToken {
            token: 0,
            logprob: self.params.logprobs.map(|_| 0.0),
            top_logprobs: Vec::new(),
        }
    }

    /// Steps 2-11 of the module docs over a non-empty row already sanitized.
    fn sample_sanitized(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> SampledToken {
        self.undo.clear();
        for &(id, bias) in &self.params.logit_bias {
            if let Some(x) = logits.get_mut(id as usize) {
                self.undo.push((id, *x));
                *x = clean(*x + bias);
            }
        }
        self.apply_penalties(logits, prompt, generated);

        let (best, max) = argmax(logits);
        if max == f32::NEG_INFINITY {
            // Everything is banned: put back what bias/penalties changed, take that argmax.
            for &(id, x) in self.undo.iter().rev() {
                logits[id as usize] = x;
            }
            let fallback = argmax(logits).0;
            let top_logprobs = match self.params.logprobs {
                Some(n) if n > 0 => vec![TokenLogprob {
                    token: fallback,
                    logprob: 0.0,
                }],
                _ => Vec::new(),
            };
            return SampledToken {
                token: fallback,
                logprob: self.params.logprobs.map(|_| 0.0),
                top_logprobs,
            };
        }

        let t = self.params.temperature;
        // A NaN temperature (unvalidated params) is sent to greedy too.
        let token = if t.is_nan() || t <= 0.0 {
            best
        } else {
            // An infinite temperature would make `-inf / t` NaN; the largest finite one is
            // already uniform over the finite logits.
            self.sample_truncated(logits, max, t.min(f32::MAX))
        };

        match self.params.logprobs {
            None => SampledToken {
                token,
                logprob: None,
                top_logprobs: Vec::new(),
            },
            Some(n) => {
                let (logprob, top_logprobs) = self.logprobs(logits, max, token, n);
                SampledToken {
                    token,
                    logprob: Some(logprob),
                    top_logprobs,
                }
            }
        }
    }

    /// Repetition, then frequency and presence penalties (module docs, step 3).
    fn apply_penalties(&mut self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        let p = &self.params;
        let n = logits.len();
        let rep = p.repetition_penalty;
        let use_rep = rep != 1.0 && rep > 0.0 && rep.is_finite() && p.repeat_last_n > 0;
        let (freq, pres) = (p.frequency_penalty, p.presence_penalty);
        let use_openai = (freq != 0.0 || pres != 0.0) && !generated.is_empty();
        if !use_rep && !use_openai {
            return;
        }
        if self.counts.len() < n {
            self.counts.resize(n, 0);
        }
        let counts = &mut self.counts;
        let undo = &mut self.undo;

        if use_rep {
            let total = prompt.len() + generated.len();
            let start = total.saturating_sub(p.repeat_last_n);
            let window_prompt = &prompt[start.min(prompt.len())..];
            let window_gen = &generated[start.saturating_sub(prompt.len())..];
            // Mark each distinct id once, penalize on first sight, then clear the marks.
            for &id in window_prompt.iter().chain(window_gen) {
                let i = id as usize;
                if i < n && counts[i] == 0 {
                    counts[i] = 1;
                    let x = logits[i];
                    undo.push((id, x));
                    logits[i] = clean(if x > 0.0 { x / rep } else { x * rep });
                }
            }
            for &id in window_prompt.iter().chain(window_gen) {
                if let Some(c) = counts.get_mut(id as usize) {
                    *c = 0;
                }
            }
        }

        if use_openai {
            for &id in generated {
                let i = id as usize;
                if i < n {
                    counts[i] = counts[i].saturating_add(1);
                }
            }
            for &id in generated {
                let i = id as usize;
                if i < n && counts[i] > 0 {
                    let c = counts[i] as f32;
                    counts[i] = 0;
                    undo.push((id, logits[i]));
                    logits[i] = clean(logits[i] - (c * freq + pres));
                }
            }
        }
        debug_assert!(
            self.counts.iter().all(|&c| c == 0),
            "penalty counters not cleared"
        );
    }

    /// Temperature, top-k, top-p, min-p, then one draw (module docs, steps 7-11).
    /// `max` is the finite maximum of `logits`; `t` is finite and > 0.
    fn sample_truncated(&mut self, logits: &[f32], max: f32, t: f32) -> u32 {
        let p = &self.params;
        let n = logits.len();
        let use_top_k = p.top_k > 0 && p.top_k < n;
        let top_p = f64::from(p.top_p);
        let use_top_p = top_p < 1.0;
        let use_min_p = p.min_p > 0.0;
        if !use_top_k && !use_top_p && !use_min_p {
            return self.draw_from_row(logits, max, t);
        }
        // min-p keeps weight >= min_p * weight(max) = min_p, i.e. (x - max) / t >= ln(min_p).
        let log_min_p = if use_min_p {
            p.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        let keeps_min_p = |x: f32| x > f32::NEG_INFINITY && (x - max) / t >= log_min_p;
        let w = |id: usize| exp_f32((logits[id] - max) / t);

        let keys = &mut self.keys;
        // `z` normalizes the top-k distribution that top-p's cumulative sum runs over.
        let mut z = 0.0f64;
        let mut kept = None;
        if use_top_k {
            let k = p.top_k;
            if k <= SMALL_TOP_K {
                top_n_keys(logits, k, keys);
            } else {
                fill_finite_keys(logits, keys);
                if keys.len() > k {
                    keys.select_nth_unstable(k - 1);
                    keys.truncate(k);
                }
                keys.sort_unstable();
            }
            if use_top_p {
                z = keys.iter().map(|&k| f64::from(w(key_id(k)))).sum();
            }
            // Sorted by descending logit, so min-p removes a suffix.
            let cut = keys.partition_point(|&k| keeps_min_p(logits[key_id(k)]));
            keys.truncate(cut);
            if use_top_p {
                kept = top_p_prefix(keys, 0, 0.0, z, top_p, &w).0;
            }
        } else {
            if use_top_p {
                z = sum_exp(logits, max, t);
            }
            keys.clear();
            keys.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|&(_, &x)| keeps_min_p(x))
                    .map(|(i, &x)| key(i, x)),
            );
            if use_top_p {
                // Sort a growing head at a time: the top-p set is usually small, and only
                // the part of the order the cumulative sum walks over is ever sorted.
                let (mut sorted, mut chunk, mut cum) = (0, TOP_P_HEAD, 0.0);
                while sorted < keys.len() {
                    let len = keys.len();
                    let end = (sorted + chunk).min(len);
                    if end < len {
                        keys[sorted..].select_nth_unstable(end - sorted - 1);
                    }
                    keys[sorted..end].sort_unstable();
                    let (found, c) = top_p_prefix(&keys[..end], sorted, cum, z, top_p, &w);
                    if found.is_some() {
                        kept = found;
                        break;
                    }
                    (sorted, chunk, cum) = (end, chunk.saturating_mul(4), c);
                }
            }
        }
        if let Some(len) = kept {
            keys.truncate(len);
        }

        // The max token always survives truncation with weight exp(0) = 1, so `total >= 1`
        // unless every candidate was filtered (impossible for t > 0; guarded anyway).
        let weights = &mut self.weights;
        weights.clear();
        weights.extend(keys.iter().map(|&k| w(key_id(k))));
        let total: f64 = weights.iter().map(|&x| f64::from(x)).sum();
        if keys.is_empty() || total.is_nan() || total <= 0.0 {
            return argmax(logits).0;
        }
        let target = self.rng.next_f64() * total;
        let i = pick(weights, target);
        key_id(keys[i]) as u32
    }

    /// Pure temperature sampling over the whole row (no truncation, no sort).
    fn draw_from_row(&mut self, logits: &[f32], max: f32, t: f32) -> u32 {
        let weights = &mut self.weights;
        weights.clear();
        weights.extend(logits.iter().map(|&x| exp_f32((x - max) / t)));
        let total = sum_f64(weights);
        let target = self.rng.next_f64() * total;
        pick(weights, target) as u32
    }

    /// The chosen token's logprob and the top `n`, from log_softmax of the processed logits.
    fn logprobs(
        &mut self,
        logits: &[f32],
        max: f32,
        token: u32,
        n: usize,
    ) -> (f32, Vec<TokenLogprob>) {
        let lse = f64::from(max) + sum_exp(logits, max, 1.0).ln();
        // Saturate at -f32::MAX: a finite logit keeps a finite (serializable) logprob even
        // when it is ~1e38 below the maximum.
        let logprob_of = |x: f32| {
            if x == f32::NEG_INFINITY {
                f32::NEG_INFINITY
            } else {
                (f64::from(x) - lse).max(-f64::from(f32::MAX)) as f32
            }
        };
        let chosen = logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| logprob_of(x));
        top_n_keys(logits, n, &mut self.top);
        let out = self
            .top
            .iter()
            .map(|&k| TokenLogprob {
                token: key_id(k) as u32,
                logprob: logprob_of(logits[key_id(k)]),
            })
            .collect();
        (chosen, out)
    }
}

/// Up to this `top_k`, candidates are picked in one streaming pass instead of a selection.
const SMALL_TOP_K: usize = 256;

/// Walks `keys[from..]` (sorted) adding probabilities `w / z` to `cum`. Returns the length of
/// the smallest prefix of `keys` reaching `top_p`, if reached, and the cumulative sum so far.
fn top_p_prefix(
    keys: &[u64],
    from: usize,
    mut cum: f64,
    z: f64,
    top_p: f64,
    w: &impl Fn(usize) -> f32,
) -> (Option<usize>, f64) {
    for (i, &k) in keys.iter().enumerate().skip(from) {
        cum += f64::from(w(key_id(k))) / z;
        if cum >= top_p - TOP_P_EPSILON {
            return (Some(i + 1), cum);
        }
    }
    (None, cum)
}

/// Index of the first weight whose cumulative sum exceeds `target` (the last positive weight
/// if rounding left `target` at the very top). `weights` is non-empty.
fn pick(weights: &[f32], target: f64) -> usize {
    let mut cum = 0.0f64;
    let mut last_positive = 0;
    // Skip whole blocks first: the common case lands in one block of 64.
    let mut base = 0;
    for block in weights.chunks(64) {
        let s = sum_f64(block);
        if cum + s > target {
            for (j, &w) in block.iter().enumerate() {
                cum += f64::from(w);
                if w > 0.0 {
                    last_positive = base + j;
                }
                if target < cum {
                    return base + j;
                }
            }
            return last_positive;
        }
        cum += s;
        if let Some(j) = block.iter().rposition(|&w| w > 0.0) {
            last_positive = base + j;
        }
        base += block.len();
    }
    last_positive
}

/// Keys of every finite logit, in id order.
fn fill_finite_keys(logits: &[f32], keys: &mut Vec<u64>) {
    keys.clear();
    keys.extend(
        logits
            .iter()
            .enumerate()
            .filter(|&(_, &x)| x > f32::NEG_INFINITY)
            .map(|(i, &x)| key(i, x)),
    );
}

/// The `n` best finite logits as sorted keys, in one pass (cheap for small `n`: most values
/// fail the first comparison).
fn top_n_keys(logits: &[f32], n: usize, out: &mut Vec<u64>) {
    out.clear();
    if n == 0 {
        return;
    }
    let mut worst_x = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        if x < worst_x || x == f32::NEG_INFINITY {
            continue;
        }
        let k = key(i, x);
        if out.len() == n {
            match out.last() {
                Some(&last) if k < last => {
                    out.pop();
                }
                _ => continue,
            }
        }
        let at = out.partition_point(|&e| e < k);
        out.insert(at, k);
        if out.len() == n {
            worst_x = out.last().map_or(f32::NEG_INFINITY, |&k| logits[key_id(k)]);
        }
    }
}

/// `sum(exp((x - max) / t))` over the row, in a fixed order (deterministic). Blocks go
/// through a stack buffer so that the exponentials vectorize.
fn sum_exp(logits: &[f32], max: f32, t: f32) -> f64 {
    let mut buf = [0.0f32; 256];
    let mut total = 0.0f64;
    for block in logits.chunks(256) {
        let buf = &mut buf[..block.len()];
        for (b, &x) in buf.iter_mut().zip(block) {
            *b = exp_f32((x - max) / t);
        }
        total += sum_f64(buf);
    }
    total
}

fn sum_f64(xs: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 4];
    let mut chunks = xs.chunks_exact(4);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f64::from(x);
        }
    }
    let rest: f64 = chunks.remainder().iter().map(|&x| f64::from(x)).sum();
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + rest
}

/// `e^x` for `x <= 0` (the only use here), within ~2 ulp; `0` below -87 (so `-inf` gives `0`).
///
/// Cephes' `expf` reduction and polynomial written with plain IEEE adds and multiplies (no
/// libm call, no FMA), so it vectorizes and returns the same bits on every platform — which
/// the "same seed, same text" promise needs. Above 88 it saturates at `e^88`.
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 0.693359375 = 355/512 exactly, so `n * LN2_HI` has no rounding error.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut y = 1.987_569_1e-4;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5;
    let y = y * (r * r) + r + 1.0;
    // 2^n by building the exponent field; n is in [-126, 127] after the clamp. `shifted`
    // is 1.5 * 2^23 + n, so its low mantissa bits hold n in two's complement (integer ops
    // only, which keeps the loop vectorizable, unlike a float-to-int cast).
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let pow2 = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * pow2
    }
}

/// NaN -> -inf, +inf -> f32::MAX.
fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// Counts the row's NaN and infinite values and cleans them in place (module docs, step 1).
/// A finite row (every row of a healthy model) is only read: one branch-free count that
/// vectorizes, which is also the whole cost of the engine's fault check. Only a row with
/// something to clean pays for the per-kind counts and the writes.
fn sanitize(logits: &mut [f32]) -> NonFiniteLogits {
    let mut found = NonFiniteLogits {
        len: logits.len(),
        ..NonFiniteLogits::default()
    };
    // u32 lanes (twice as many per vector as usize; a row's length fits in u32, token ids
    // being u32), wrapping so no length can make it panic.
    let non_finite = logits
        .iter()
        .fold(0u32, |n, x| n.wrapping_add(u32::from(!x.is_finite())));
    if non_finite == 0 {
        return found;
    }
    for x in logits.iter_mut() {
        if x.is_nan() {
            found.nan += 1;
        } else if *x == f32::INFINITY {
            found.pos_inf += 1;
        } else if *x == f32::NEG_INFINITY {
            found.neg_inf += 1;
        }
        *x = clean(*x);
    }
    found
}

/// (first index of the maximum, maximum); (0, -inf) if every value is -inf. No NaN expected.
/// An 8-lane max (vectorizable), then the first index holding it.
fn argmax(logits: &[f32]) -> (u32, f32) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = logits.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
    let at = logits.iter().position(|&x| x == max).unwrap_or(0);
    (at as u32, max)
}

/// A seed from OS entropy; if the OS cannot provide it, the clock and an address (so that the
/// sampler still works, just without a strong seed).
fn entropy_seed() -> u64 {
    let mut buf = [0u8; 8];
    if rand::rngs::OsRng.try_fill_bytes(&mut buf).is_ok() {
        return u64::from_le_bytes(buf);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    splitmix64(&mut (nanos ^ (&local as *const u8 as u64)))
}

/// SplitMix64 step (Steele, Lea, Flood 2014): advances `state`, returns the mixed output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256** 1.0 (Blackman & Vigna, <https://prng.di.unimi.it/xoshiro256starstar.c>),
/// state filled from the seed by SplitMix64 as the authors recommend. Written out here rather
/// than taken from `rand`, whose `StdRng` algorithm may change between versions: a seed must
/// give the same text forever.
#[derive(Debug, Clone)]
struct Xoshiro256StarStar {
    s: [u64; 4],
}

impl Xoshiro256StarStar {
    fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        // SplitMix64 never yields four zero words in a row, so the state is never all-zero.
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
            ..SamplingParams::default()
        }
    }

    #[test]
    fn splitmix64_matches_reference_vector() {
        // First outputs of SplitMix64 from state 0 (reference C implementation).
        let mut s = 0u64;
        let got: Vec<u64> = (0..4).map(|_| splitmix64(&mut s)).collect();
        assert_eq!(
            got,
            [
                0xe220a8397b1dcdaf,
                0x6e789e6aa1b965f4,
                0x06c45d188009454f,
                0xf88bb8a8724c81ec
            ]
        );
    }

    #[test]
    fn xoshiro_matches_reference_for_seed_42() {
        // Computed by an independent transcription of xoshiro256starstar.c, seeded by
        // SplitMix64(42). Changing these values changes every seeded output: don't.
        let mut r = Xoshiro256StarStar::seed_from_u64(42);
        let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                0x15780b2e0c2ec716,
                0x6104d9866d113a7e,
                0xae17533239e499a1,
                0xecb8ad4703b360a1
            ]
        );
    }

    #[test]
    fn next_f64_is_in_unit_interval() {
        let mut r = Xoshiro256StarStar::seed_from_u64(1);
        for _ in 0..10_000 {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }

    #[test]
    fn clean_and_sanitize() {
        assert_eq!(clean(f32::NAN), f32::NEG_INFINITY);
        assert_eq!(clean(f32::INFINITY), f32::MAX);
        assert_eq!(clean(-3.0), -3.0);
        let mut row = [f32::NAN, 1.0, f32::INFINITY, f32::INFINITY];
        sanitize(&mut row);
        assert_eq!(row, [f32::NEG_INFINITY, 1.0, f32::MAX, f32::MAX]);
        assert_eq!(argmax(&row), (2, f32::MAX));
        let mut dead = [f32::NAN, f32::NEG_INFINITY];
        sanitize(&mut dead);
        assert_eq!(argmax(&dead), (0, f32::NEG_INFINITY));
    }

    #[test]
    fn sanitize_counts_what_it_cleans() {
        let mut row = [
            f32::NAN,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -2.0,
        ];
        let found = sanitize(&mut row);
        assert_eq!(
            found,
            NonFiniteLogits {
                nan: 2,
                pos_inf: 1,
                neg_inf: 1,
                len: 6
            }
        );
        assert!(found.any());
        assert_eq!(found.to_string(), "NaN, +inf and -inf in 4 of 6 logits");
        let mut fine = [0.0, -f32::MAX, f32::MAX, 1e-40];
        let found = sanitize(&mut fine);
        assert!(!found.any(), "{found:?}");
        // Every lane of the vectorized loop and the remainder are counted.
        let mut long = vec![0.5f32; 1001];
        for i in (0..1001).step_by(7) {
            long[i] = f32::INFINITY;
        }
        let found = sanitize(&mut long);
        assert_eq!((found.pos_inf, found.nan, found.neg_inf), (143, 0, 0));
        assert_eq!(found.to_string(), "+inf in 143 of 1001 logits");
    }

    #[test]
    fn try_sample_refuses_non_finite_rows_and_consumes_nothing() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut checked = Sampler::new(plain(1.0));
            let mut reference = Sampler::new(plain(1.0));
            let mut row = vec![0.1f32, 2.0, -1.0, 0.7];
            row[2] = bad;
            let err = checked
                .try_sample(&mut row, &[], &[])
                .expect_err("a non-finite row is refused");
            assert_eq!(err.len, 4);
            assert_eq!(err.nan + err.pos_inf + err.neg_inf, 1, "{bad}");
            // No draw was taken: the next finite rows give what a fresh sampler gives.
            for _ in 0..20 {
                let row = [0.1f32, 2.0, -1.0, 0.7];
                let a = checked
                    .try_sample(&mut row.clone(), &[], &[])
                    .expect("finite");
                let b = reference.sample(&mut row.clone(), &[], &[]);
                assert_eq!(a.token, b.token);
            }
        }
        // A finite row samples exactly as `sample` does, logprobs included.
        let params = SamplingParams {
            logprobs: Some(3),
            ..plain(0.9)
        };
        let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
        for i in 0..50 {
            let row: Vec<f32> = (0..64)
                .map(|j| ((i * 7 + j * 13) % 17) as f32 * 0.3)
                .collect();
            let x = a
                .try_sample(&mut row.clone(), &[1, 2], &[3])
                .expect("finite");
            let y = b.sample(&mut row.clone(), &[1, 2], &[3]);
            assert_eq!(
                (x.token, x.logprob, x.top_logprobs),
                (y.token, y.logprob, y.top_logprobs)
            );
        }
        assert!(Sampler::new(plain(1.0))
            .try_sample(&mut [], &[], &[])
            .is_ok());
    }

    #[test]
    fn penalty_counters_are_cleared_between_calls() {
        let params = SamplingParams {
            repetition_penalty: 1.3,
            frequency_penalty: 0.5,
            presence_penalty: 0.5,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params);
        let mut row = vec![1.0f32; 16];
        // Out-of-vocab ids (99) are ignored, duplicates counted.
        s.sample(&mut row, &[1, 2, 99, 2], &[3, 3, 99, 4]);
        assert!(s.counts.iter().all(|&c| c == 0));
        assert_eq!(s.counts.len(), 16);
    }

    #[test]
    fn infinite_logit_wins_ties_among_infinities() {
        let mut s = Sampler::new(plain(1.0));
        for _ in 0..200 {
            let mut row = [0.0, f32::INFINITY, 5.0, f32::INFINITY];
            let t = s.sample(&mut row, &[], &[]).token;
            assert!(t == 1 || t == 3, "{t}");
        }
    }

    #[test]
    fn top_p_without_top_k_reaches_into_the_unsorted_tail() {
        // 3000 nearly equal tokens: the top-p set (90%) is far larger than the sorted head,
        // so the tail must be sorted too, and the cut must land exactly where the
        // cumulative sum reaches 0.9.
        let n = 3000usize;
        let logits: Vec<f32> = (0..n).map(|i| -(i as f32) * 1e-4).collect();
        let w: Vec<f64> = logits.iter().map(|&x| f64::from(x).exp()).collect();
        let z: f64 = w.iter().sum();
        let mut cum = 0.0;
        let mut cut = n;
        for (i, wi) in w.iter().enumerate() {
            cum += wi / z;
            if cum >= 0.9 - TOP_P_EPSILON {
                cut = i + 1;
                break;
            }
        }
        assert!(cut > TOP_P_HEAD && cut < n, "{cut}");
        let params = SamplingParams {
            top_p: 0.9,
            ..plain(1.0)
        };
        let mut s = Sampler::new(params);
        let mut max_seen = 0;
        for _ in 0..4000 {
            let mut row = logits.clone();
            let t = s.sample(&mut row, &[], &[]).token as usize;
            assert!(t < cut, "token {t} is outside the top-p set (< {cut})");
            max_seen = max_seen.max(t);
        }
        assert!(
            max_seen > TOP_P_HEAD,
            "never sampled past the head: {max_seen}"
        );
    }

    #[test]
    fn seedless_samplers_draw_different_seeds() {
        let a = Sampler::new(SamplingParams::default()).seed();
        let b = Sampler::new(SamplingParams::default()).seed();
        assert_ne!(a, b);
    }

    #[test]
    fn exp_f32_is_accurate_on_the_sampling_domain() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_f32(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert!(exp_f32(100.0).is_finite());
    }

    #[test]
    fn keys_order_by_descending_logit_then_ascending_id() {
        let xs = [-f32::MAX, -1.0, -0.0, 0.0, 1e-30, 2.0, f32::MAX];
        for w in xs.windows(2) {
            assert!(
                key(5, w[1]) < key(5, w[0]),
                "{} should sort before {}",
                w[1],
                w[0]
            );
        }
        assert!(key(3, 1.0) < key(4, 1.0));
        assert_eq!(key_id(key(262_143, -3.5)), 262_143);
    }

    #[test]
    fn top_n_keys_matches_a_full_sort() {
        let mut x = 9u64;
        let row: Vec<f32> = (0..5000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((x >> 56) as f32) - 128.0 // many ties
            })
            .collect();
        let mut all: Vec<u64> = row.iter().enumerate().map(|(i, &v)| key(i, v)).collect();
        all.sort_unstable();
        let mut out = Vec::new();
        for n in [1, 7, 40, 256, 5000, 6000] {
            top_n_keys(&row, n, &mut out);
            assert_eq!(out, all[..n.min(all.len())], "n = {n}");
        }
    }

    #[test]
    fn pick_walks_cumulative_weights() {
        let w: Vec<f32> = (0..200)
            .map(|i| if i % 3 == 0 { 1.0 } else { 0.0 })
            .collect();
        assert_eq!(pick(&w, 0.0), 0);
        assert_eq!(pick(&w, 0.999), 0);
        assert_eq!(pick(&w, 1.0), 3);
        assert_eq!(pick(&w, 30.5), 90);
        // Past the total (rounding): the last positive weight, never a zero-weight token.
        assert_eq!(pick(&w, 1e9), 198);
    }
}
