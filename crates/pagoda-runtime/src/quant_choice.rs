//! The automatic quantization choice (`--quantize auto`, and the default for a float Hugging
//! Face folder that would not fit): the highest-quality weight format whose weights plus the
//! KV cache for the requested context and sequences fit the memory budget.
//!
//! Owns [`QuantizeFlag`] (what `--quantize` accepts: `auto` or a type), [`AutoQuantize`] (when
//! the choice is made), [`FitBudget`] (what it sizes against), [`kv_bytes`] (the KV arithmetic
//! the server's memory plan uses too), [`default_memory_budget`] (the server's default budget,
//! shared by the CLI), and [`decide`] / [`pick`] with the [`QuantDecision`] that says what was
//! picked and why.
//!
//! Invariants: the ladder is the stored float type, then f16 (from f32 only), Q8_0, Q6_K,
//! Q5_K, Q4_K, best first, and the first that fits is taken; sizes are computed from the
//! tensors' shapes by pagoda-compress's own rules (the output head's type, row fallbacks), so
//! the estimate is what quantizing at load then holds; a model whose weight matrices are
//! already quantized (a Q4_K GGUF, a GPTQ folder) is never requantized by the choice; when no
//! format fits, [`AutoQuantError::NothingFits`] names every size and the flags to change.

use pagoda_compress::quantize::rules::{self, Plan};
use pagoda_compress::quantize::target::user_name;
use pagoda_compress::quantize::QuantTarget;
use pagoda_engine::StatePlan;
use pagoda_kernels::GgmlType;
use pagoda_model::weights::Weights;
use pagoda_model::{KvDtype, ModelConfig, PagedKvCache};

/// The memory budget when the operator names none: 90 % of the machine's memory (the rest
/// for the process, the page cache and the system), or none where the machine does not say.
pub fn default_memory_budget() -> Option<u64> {
    pagoda_engine::memory::total_memory().map(|t| t / 10 * 9)
}

/// The context `pagoda run` gives a model when nothing asks for another (the single-stream
/// engine's default, [`crate::single::DEFAULT_CONTEXT`]; defined here so the loader's choice
/// plans the same context without importing the engine front end).
pub const DEFAULT_CONTEXT: usize = 4096;

/// What `--quantize` accepts: `auto`, or a weight type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizeFlag {
    /// Pick the best format that fits ([`decide`]).
    Auto,
    /// Quantize to this type.
    Type(QuantTarget),
}

impl std::str::FromStr for QuantizeFlag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(QuantizeFlag::Auto);
        }
        s.parse::<QuantTarget>()
            .map(QuantizeFlag::Type)
            .map_err(|e| format!("{e} (or `auto`: the best type that fits the memory budget)"))
    }
}

impl std::fmt::Display for QuantizeFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantizeFlag::Auto => f.write_str("auto"),
            QuantizeFlag::Type(t) => write!(f, "{t}"),
        }
    }
}

/// When the loader makes the choice (with no fixed `--quantize` type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AutoQuantize {
    /// Never: the file's own types.
    #[default]
    Off,
    /// Only for a Hugging Face folder stored in f32/f16/bf16 that would not fit as stored
    /// (the front ends' default); it then says so.
    IfTooBig,
    /// Always (`--quantize auto`): the best format that fits.
    Always,
}

/// What the choice sizes against: the memory budget and the KV cache the engine will want.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitBudget {
    /// Bytes for the weights and the KV cache together (`--memory-budget`).
    pub budget: u64,
    /// Tokens per sequence (`--max-model-len`); `None`: the model's context.
    pub max_model_len: Option<usize>,
    /// Sequences at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    pub block_size: usize,
    pub kv_dtype: KvDtype,
    pub prefix_caching: bool,
    /// `--kv-cache-memory`: the KV pool's size when the operator set it.
    pub kv_cache_memory: Option<u64>,
}

impl FitBudget {
    /// One sequence of `context` tokens (capped at the model's) against the machine's default
    /// budget ([`default_memory_budget`]): what `pagoda run` asks of memory.
    pub fn single_sequence(context: usize) -> Option<FitBudget> {
        Some(FitBudget {
            budget: default_memory_budget()?,
            max_model_len: Some(context),
            max_num_seqs: 1,
            block_size: 16,
            kv_dtype: KvDtype::F16,
            prefix_caching: true,
            kv_cache_memory: None,
        })
    }

    /// The context this budget plans for on `cfg`: the asked length, at most the model's, at
    /// least 2.
    pub fn context(&self, cfg: &ModelConfig) -> usize {
        self.max_model_len
            .unwrap_or(cfg.context_length)
            .min(cfg.context_length)
            .max(2)
    }
}

/// KV (and recurrent state) bytes of `cfg` under these engine settings: `(wanted, least)`,
/// all `max_num_seqs` sequences of `max_model_len` tokens (the model's context when `None`,
/// capped at it), and one sequence. The server's memory plan sizes pools with the same numbers.
pub fn kv_bytes(
    cfg: &ModelConfig,
    max_model_len: Option<usize>,
    max_num_seqs: usize,
    block_size: usize,
    kv_dtype: KvDtype,
    prefix_caching: bool,
) -> (u64, u64) {
    let block = block_size.max(1);
    let max_len = max_model_len
        .unwrap_or(cfg.context_length)
        .min(cfg.context_length)
        .max(2);
    let per_seq =
        (PagedKvCache::bytes_per_block(cfg, block, kv_dtype) * max_len.div_ceil(block)) as u64;
    let states =
        StatePlan::for_config(cfg, max_num_seqs, prefix_caching).map_or(0, |p| p.bytes() as u64);
    (
        per_seq.saturating_mul(max_num_seqs.max(1) as u64) + states,
        per_seq + states,
    )
}

/// One rung of the ladder: a format and what its weights take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `f32 (as stored)`, `q8_0`, ...
    pub label: String,
    /// What to quantize to; `None`: serve the weights as stored.
    pub target: Option<QuantTarget>,
    /// Bytes of the weights in this format.
    pub weights: u64,
}

/// The index of the first candidate (best first) whose weights plus `kv` fit `budget`.
pub fn pick(candidates: &[Candidate], kv: u64, budget: u64) -> Option<usize> {
    candidates
        .iter()
        .position(|c| c.weights.saturating_add(kv) <= budget)
}

/// What the choice did and why, for the log and the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantDecision {
    /// Every rung considered, best first, up to the one picked.
    pub considered: Vec<Candidate>,
    /// The one picked (the last of `considered`).
    pub picked: Candidate,
    /// KV bytes planned for (all sequences).
    pub kv: u64,
    pub budget: u64,
    pub context: usize,
    pub seqs: usize,
    /// Whether it was asked for (`--quantize auto`) or made because the stored model would
    /// not fit.
    pub asked: bool,
}

impl std::fmt::Display for QuantDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = if self.asked {
            "--quantize auto"
        } else {
            "the model as stored does not fit the memory budget, so"
        };
        write!(
            f,
            "{why}: picked {}: {} of weights + {} of KV cache ({} tokens x {} sequence{}) fit the {} budget",
            self.picked.label,
            gib(self.picked.weights),
            gib(self.kv),
            self.context,
            self.seqs,
            if self.seqs == 1 { "" } else { "s" },
            gib(self.budget),
        )?;
        let over: Vec<String> = self
            .considered
            .iter()
            .filter(|c| c.label != self.picked.label)
            .map(|c| format!("{} needs {}", c.label, gib(c.weights + self.kv)))
            .collect();
        if !over.is_empty() {
            write!(f, " ({}: over the budget)", over.join(", "))?;
        }
        if !self.asked {
            f.write_str("; pass --quantize with a type (f16, q8_0, ...) to choose yourself")?;
        }
        Ok(())
    }
}

/// Why no format was picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutoQuantError {
    #[error(
        "--quantize auto: no format fits the {} memory budget with {} of KV cache ({context} tokens x {seqs} sequences): {}; raise --memory-budget, lower --max-model-len or --max-num-seqs, or use a smaller model",
        gib(*budget),
        gib(*kv),
        needs.iter().map(|(l, w)| format!("{l} needs {}", gib(w + kv))).collect::<Vec<_>>().join(", ")
    )]
    NothingFits {
        budget: u64,
        kv: u64,
        context: usize,
        seqs: usize,
        /// (format, weight bytes) of every rung.
        needs: Vec<(String, u64)>,
    },
}

/// Decides the format for `weights` (of `cfg`; `stored_bytes` is what they take as stored).
/// `Ok(None)`: no decision to make (`Off`; an already quantized model; under `IfTooBig`, a
/// model that fits, or one not stored in a float type).
pub fn decide(
    mode: AutoQuantize,
    cfg: &ModelConfig,
    weights: &Weights,
    stored_bytes: u64,
    fit: &FitBudget,
) -> Result<Option<QuantDecision>, AutoQuantError> {
    if mode == AutoQuantize::Off {
        return Ok(None);
    }
    let Some(stored) = stored_float_type(weights) else {
        // Already quantized (or no weight matrices): served as is.
        return Ok(None);
    };
    let kv = match fit.kv_cache_memory {
        Some(kv) => kv,
        None => {
            kv_bytes(
                cfg,
                fit.max_model_len,
                fit.max_num_seqs,
                fit.block_size,
                fit.kv_dtype,
                fit.prefix_caching,
            )
            .0
        }
    };
    let as_stored = Candidate {
        label: format!("{} (as stored)", stored.name().to_ascii_lowercase()),
        target: None,
        weights: stored_bytes,
    };
    if mode == AutoQuantize::IfTooBig
        && pick(std::slice::from_ref(&as_stored), kv, fit.budget).is_some()
    {
        return Ok(None);
    }
    let mut ladder = vec![as_stored];
    let rungs: &[GgmlType] = if stored == GgmlType::F32 {
        &[
            GgmlType::F16,
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::Q5_K,
            GgmlType::Q4_K,
        ]
    } else {
        &[
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::Q5_K,
            GgmlType::Q4_K,
        ]
    };
    for ty in rungs {
        let Ok(target) = QuantTarget::new(*ty) else {
            continue;
        };
        ladder.push(Candidate {
            label: user_name(*ty),
            target: Some(target),
            weights: bytes_as(weights, target),
        });
    }
    let (context, seqs) = (fit.context(cfg), fit.max_num_seqs.max(1));
    match pick(&ladder, kv, fit.budget) {
        Some(i) => Ok(Some(QuantDecision {
            picked: ladder[i].clone(),
            considered: ladder[..=i].to_vec(),
            kv,
            budget: fit.budget,
            context,
            seqs,
            asked: mode == AutoQuantize::Always,
        })),
        None => Err(AutoQuantError::NothingFits {
            budget: fit.budget,
            kv,
            context,
            seqs,
            needs: ladder.into_iter().map(|c| (c.label, c.weights)).collect(),
        }),
    }
}

/// The float type most of `weights`' matrices are stored in; `None` when any weight matrix is
/// already quantized (or there are none).
pub fn stored_float_type(weights: &Weights) -> Option<GgmlType> {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for v in weights.iter().filter(|v| rules::is_weight_matrix(v)) {
        if v.ty.is_quantized() {
            return None;
        }
        match counts.iter_mut().find(|(t, _)| *t == v.ty) {
            Some((_, n)) => *n += 1,
            None => counts.push((v.ty, 1)),
        }
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(t, _)| t)
}

/// Bytes `weights` take once quantized to `target` by the load-time rules (the output head's
/// type and row-length fallbacks included), without converting anything.
pub fn bytes_as(weights: &Weights, target: QuantTarget) -> u64 {
    let head = rules::output_head_name(weights);
    weights
        .iter()
        .map(|v| match rules::plan(v, target, v.name == head, false) {
            Plan::Convert { to, .. } => to
                .row_bytes(v.cols())
                .map_or(v.n_bytes(), |row| row.saturating_mul(v.rows())),
            _ => v.n_bytes(),
        } as u64)
        .sum()
}

/// Bytes as GiB with two decimals, or MiB/KiB below one.
fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(label: &str, weights: u64) -> Candidate {
        Candidate {
            label: label.into(),
            target: label.parse().ok(),
            weights,
        }
    }

    #[test]
    fn the_best_rung_that_fits_is_picked() {
        let ladder = [c("f16 (as stored)", 1000), c("q8_0", 540), c("q4_k", 300)];
        assert_eq!(pick(&ladder, 100, 2000), Some(0));
        assert_eq!(pick(&ladder, 100, 1100), Some(0), "exactly the budget fits");
        assert_eq!(pick(&ladder, 100, 1099), Some(1));
        assert_eq!(pick(&ladder, 100, 640), Some(1));
        assert_eq!(pick(&ladder, 100, 639), Some(2));
        assert_eq!(pick(&ladder, 100, 399), None);
        assert_eq!(pick(&ladder, u64::MAX, u64::MAX), Some(0), "no overflow");
    }

    #[test]
    fn kv_grows_with_context_and_sequences() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden/tiny-llama/config.json");
        let text = std::fs::read_to_string(path).expect("config");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        let cfg = ModelConfig::from_hf_config(&json).expect("config");
        // 2 layers x (2 KV heads x 16) values x K and V x 2 bytes = 256 bytes a token.
        let (one, least) = kv_bytes(&cfg, Some(64), 1, 16, KvDtype::F16, false);
        assert_eq!((one, least), (64 * 256, 64 * 256));
        let (four, least) = kv_bytes(&cfg, Some(64), 4, 16, KvDtype::F16, false);
        assert_eq!((four, least), (4 * 64 * 256, 64 * 256));
        // Past the model's context (256) it is capped; blocks round up.
        assert_eq!(
            kv_bytes(&cfg, Some(10_000), 1, 16, KvDtype::F16, false).0,
            256 * 256
        );
        assert_eq!(
            kv_bytes(&cfg, Some(17), 1, 16, KvDtype::F16, false).0,
            32 * 256
        );
        assert_eq!(
            kv_bytes(&cfg, Some(64), 1, 16, KvDtype::F32, false).0,
            2 * 64 * 256
        );
    }

    #[test]
    fn the_flag_takes_auto_or_a_type_and_names_auto_when_refusing() {
        assert_eq!("auto".parse::<QuantizeFlag>(), Ok(QuantizeFlag::Auto));
        assert_eq!("AUTO".parse::<QuantizeFlag>(), Ok(QuantizeFlag::Auto));
        let q8: QuantTarget = "q8_0".parse().expect("q8_0");
        assert_eq!("q8_0".parse::<QuantizeFlag>(), Ok(QuantizeFlag::Type(q8)));
        let e = "q3_xl".parse::<QuantizeFlag>().expect_err("unknown");
        assert!(e.contains("auto"), "{e}");
    }

    #[test]
    fn the_decision_and_the_refusal_name_the_sizes() {
        let d = QuantDecision {
            considered: vec![c("f16 (as stored)", 3 << 30), c("q8_0", 1 << 30)],
            picked: c("q8_0", 1 << 30),
            kv: 1 << 29,
            budget: 2 << 30,
            context: 4096,
            seqs: 4,
            asked: true,
        };
        let s = d.to_string();
        for part in [
            "picked q8_0",
            "1.00 GiB of weights",
            "512.0 MiB of KV",
            "4096 tokens x 4 sequences",
            "2.00 GiB budget",
            "f16 (as stored) needs 3.50 GiB",
        ] {
            assert!(s.contains(part), "{part} missing from: {s}");
        }
        let e = AutoQuantError::NothingFits {
            budget: 1 << 30,
            kv: 1 << 29,
            context: 4096,
            seqs: 1,
            needs: vec![
                ("f16 (as stored)".into(), 3 << 30),
                ("q4_k".into(), 1 << 30),
            ],
        }
        .to_string();
        for part in [
            "1.00 GiB memory budget",
            "q4_k needs 1.50 GiB",
            "--memory-budget",
            "--max-model-len",
        ] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
    }
}
