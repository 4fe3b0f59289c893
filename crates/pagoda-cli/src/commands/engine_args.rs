//! The serving-engine flags shared by every command that runs the batching engine (`batch`,
//! `bench batching`, `serve`), and their translation into an [`EngineConfig`]; the load
//! flags ([`LoadArgs`]: `--quantize`) and the speculative decoding flags ([`SpecArgs`]) come
//! with them.

use crate::commands::model_loader::{load_for_generation, LoadArgs};
use anyhow::bail;
use clap::Args;
use pagoda_engine::speculative::ngram::NgramProposer;
use pagoda_engine::{BatchingMode, EngineConfig, Policy, ProposerConfig, SpeculativeConfig};
use pagoda_model::{DeviceChoice, KvDtype};

/// Speculative decoding flags (vLLM's and llama.cpp's ideas, Pagoda's names).
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt lookup: proposals copied from earlier in the
    /// prompt and output; no extra model) or `draft` (a smaller model with the same
    /// tokenizer proposes; needs --draft-model). Output is unchanged: greedy decoding gives
    /// the same tokens, sampling the same distribution. Requests may turn it off with
    /// `"speculative": false`.
    #[arg(long, value_name = "METHOD")]
    pub speculative: Option<String>,
    /// The draft model for --speculative draft (a store name or path), e.g.
    /// qwen2.5-coder:0.5b for qwen2.5-coder:1.5b. Implies --speculative draft.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// Most tokens proposed per step (7: the last token and seven proposals are one pass of
    /// the CPU strip kernels, which take up to 8 tokens per weight read).
    #[arg(long, default_value_t = 7)]
    pub num_speculative_tokens: usize,
    /// Always propose --num-speculative-tokens (default: adapt per request to its acceptance
    /// and the measured costs, turning speculation off while it does not pay).
    #[arg(long)]
    pub no_adaptive_speculation: bool,
    /// Prompt lookup: shortest and longest n-gram matched.
    #[arg(long, default_value_t = 2)]
    pub ngram_min: usize,
    #[arg(long, default_value_t = 4)]
    pub ngram_max: usize,
}

impl SpecArgs {
    /// The speculation these flags ask for (loads the draft model), or `None`.
    /// The draft model goes on `device`, the main model's.
    pub fn config(&self, device: DeviceChoice) -> anyhow::Result<Option<SpeculativeConfig>> {
        let method = match (&self.speculative, &self.draft_model) {
            (None, None) => return Ok(None),
            (Some(m), _) => m.to_ascii_lowercase(),
            (None, Some(_)) => "draft".to_string(),
        };
        let proposer = match method.as_str() {
            "ngram" => ProposerConfig::Ngram(NgramProposer {
                min_n: self.ngram_min,
                max_n: self.ngram_max,
            }),
            "draft" => {
                let Some(name) = &self.draft_model else {
                    bail!(
                        "--speculative draft needs --draft-model MODEL (e.g. qwen2.5-coder:0.5b)"
                    );
                };
                let draft = load_for_generation(
                    name,
                    &LoadArgs {
                        quantize: None,
                        device,
                        gpu_layers: None,
                        unsafe_control_tokens_in_messages: false,
                    },
                )?;
                ProposerConfig::Draft {
                    model: draft.model,
                    tokenizer: draft.tokenizer,
                }
            }
            other => bail!("unknown --speculative method `{other}`: use ngram or draft"),
        };
        let config = SpeculativeConfig {
            proposer,
            num_tokens: self.num_speculative_tokens,
            adaptive: !self.no_adaptive_speculation,
        };
        config.validate()?;
        Ok(Some(config))
    }
}

/// The limits a server (or a batch job answering the same requests) puts on every request.
#[derive(Debug, Clone, Args)]
pub struct RequestLimitArgs {
    /// Most output tokens per choice a request may get; a request that sets no max_tokens
    /// gets the smaller of this and the context left (default: the context is the limit).
    /// OpenAI requests asking for more get a 400 naming max_tokens; Ollama's num_predict is
    /// clamped to it.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens_limit: Option<u32>,
}

impl RequestLimitArgs {
    /// `--max-tokens-limit` as a token count.
    pub fn max_tokens_limit(&self) -> Option<usize> {
        self.max_tokens_limit.map(|v| v as usize)
    }
}

/// Engine flags (vLLM's names where it has one).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Most sequences in one step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Most tokens (decode + prefill chunks) in one step; long prompts are prefilled in chunks
    /// of at most this many tokens, so they do not stall other requests' decoding.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// KV cache memory, e.g. 512MiB or 2GB (default: 40% of available RAM, capped at what
    /// --max-num-seqs full-length sequences need).
    #[arg(long, value_parser = parse_size)]
    pub kv_cache_memory: Option<u64>,
    /// KV cache element type: f16, f32 (CPU only) or fp8 (E4M3 with a static scale of 1, as
    /// vLLM's `--kv-cache-dtype fp8`: half f16's bytes, so twice the KV blocks in the same
    /// memory, at some accuracy cost; docs/benchmarks.md measures it).
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Scheduling policy: fcfs, priority (per-request `priority`, vLLM's meaning: lower runs
    /// earlier; with aging) or sjf (shortest predicted job first: prompt left plus max_tokens
    /// or the model's running average output; with aging).
    #[arg(long, default_value = "fcfs")]
    pub policy: Policy,
    /// Turn off reuse of cached prompt prefixes.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Longest sequence (prompt + output); default: the model's context length.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// On a GPU: the share of the card's memory Pagoda may use for the weights, the
    /// activation workspace and the KV cache together (vLLM's --gpu-memory-utilization); the
    /// KV cache gets what is left of it after the other two (reported at start).
    /// --kv-cache-memory overrides it.
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    pub gpu_memory_utilization: f64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl EngineArgs {
    /// The engine configuration these flags ask for, batching in `mode`.
    pub fn config(&self, mode: BatchingMode) -> EngineConfig {
        EngineConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            policy: self.policy,
            mode,
            block_size: self.block_size,
            kv_dtype: self.kv_cache_dtype,
            kv_cache_memory: self.kv_cache_memory,
            prefix_caching: !self.no_prefix_caching,
            max_model_len: self.max_model_len,
            gpu_memory_utilization: self.gpu_memory_utilization,
            ..EngineConfig::default()
        }
    }

    /// [`EngineArgs::config`] with the speculative decoding the flags ask for (which loads a
    /// draft model, if any).
    pub fn config_with_speculation(&self, mode: BatchingMode) -> anyhow::Result<EngineConfig> {
        Ok(EngineConfig {
            speculative: self.spec.config(self.load.device)?,
            ..self.config(mode)
        })
    }
}

/// Parses `512MiB`, `2GB`, `1.5GiB`, `1000000` (bytes) into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512MiB, 2GB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("`{text}` must be a positive size"));
    }
    Ok((value * scale) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }

    /// The engine flags as `serve` parses them.
    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn kv_cache_dtype_accepts_fp8_and_refuses_unknown_values_by_name() {
        use clap::Parser;
        let parse = |v: &str| Flags::try_parse_from(["serve", "--kv-cache-dtype", v]);
        for (v, want) in [
            ("fp8", KvDtype::Fp8E4m3),
            ("fp8_e4m3", KvDtype::Fp8E4m3),
            ("f16", KvDtype::F16),
            ("f32", KvDtype::F32),
        ] {
            let flags = parse(v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(flags.engine.kv_cache_dtype, want, "{v}");
        }
        assert_eq!(
            Flags::try_parse_from(["serve"])
                .expect("defaults")
                .engine
                .kv_cache_dtype,
            KvDtype::F16
        );
        let err = parse("int4").expect_err("unknown dtype").to_string();
        assert!(
            err.contains("--kv-cache-dtype") && err.contains("`int4`") && err.contains("fp8"),
            "{err}"
        );
        let err = parse("fp8_e5m2").expect_err("e5m2").to_string();
        assert!(err.contains("E4M3"), "{err}");
    }
}
