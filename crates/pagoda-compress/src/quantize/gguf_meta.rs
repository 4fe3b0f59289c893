//! GGUF metadata for a Hugging Face folder: what llama.cpp's `convert_hf_to_gguf.py` writes
//! for a Llama or Qwen2 model, made from `config.json` (as Pagoda parsed it), `tokenizer.json`,
//! `tokenizer_config.json` and the chat template — the inverse of `hf_write`'s config and
//! tokenizer files.
//!
//! - Hyperparameters: `general.architecture`, `general.name`, `{arch}.context_length`,
//!   `embedding_length`, `block_count`, `feed_forward_length`, `attention.head_count(_kv)`,
//!   `attention.layer_norm_rms_epsilon`, `rope.freq_base`, `rope.dimension_count`,
//!   `vocab_size`, `attention.key_length`/`value_length` when `head_dim` is not
//!   `hidden / heads`, and linear / YaRN RoPE scaling as keys. Llama 3 scaling has no key:
//!   llama.cpp carries it as a `rope_freqs.weight` tensor of per-frequency divisors
//!   ([`llama3_rope_factors`]).
//! - Tokenizer (byte-level BPE only, `tokenizer.ggml.model = "gpt2"`): every id below the
//!   model's `vocab_size` in id order (holes as `[PAD{id}]`, type unused), token types
//!   (normal; control for special added tokens and those that look special, `<|...|>`;
//!   user-defined for the other added tokens), merges as `"a b"` strings, BOS/EOS/UNK/PAD ids,
//!   `add_bos_token`/`add_eos_token` as Pagoda's tokenizer of the folder behaves, and
//!   `tokenizer.ggml.pre` chosen as llama.cpp does — the SHA-256 of the token ids of its
//!   check text against the known pre-tokenizers — or, for a vocabulary no published model
//!   has, from the shape of `tokenizer.json`'s pre-tokenizer (the regex llama.cpp would run).
//!
//! Invariants: only pre-tokenizer names whose regex both llama.cpp and Pagoda's GGUF tokenizer
//! implement are written; anything else (SentencePiece vocabularies, WordPiece/Unigram
//! models, an unknown pre-tokenizer, Gemma 3) is an error naming what is missing, raised
//! before any output file exists.

use std::collections::HashMap;
use std::path::Path;

use pagoda_model::config::yarn_mscale;
use pagoda_model::gguf::{GgufArray, GgufValue};
use pagoda_model::tokenizer::gguf::{LLAMA3_REGEX, QWEN2_REGEX};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{Architecture, ModelConfig, RopeScaling};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::CompressError;

/// llama.cpp token types.
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_USER_DEFINED: i32 = 4;
pub const TOKEN_UNUSED: i32 = 5;

/// llama.cpp's pre-tokenizer check text (`get_vocab_base_pre` in `convert_hf_to_gguf.py`):
/// its token ids, hashed, identify the pre-tokenizer of a published vocabulary.
const CHECK_TEXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u{200d}🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// SHA-256 of `str(ids)` of [`CHECK_TEXT`] → `tokenizer.ggml.pre`, for the pre-tokenizers
/// Pagoda's GGUF tokenizer implements (hashes from llama.cpp's table).
const KNOWN_PRE_HASHES: [(&str, &str); 12] = [
    (
        "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
        "smollm",
    ),
    (
        "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
        "qwen2",
    ),
    (
        "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c",
        "qwen2",
    ),
    (
        "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5",
        "deepseek-r1-qwen",
    ),
    (
        "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
        "llama-bpe",
    ),
    (
        "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d",
        "smaug-bpe",
    ),
    (
        "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e",
        "dbrx",
    ),
    (
        "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454",
        "gpt-2",
    ),
    (
        "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4",
        "gpt-2",
    ),
    (
        "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34",
        "starcoder",
    ),
    (
        "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff",
        "refact",
    ),
    (
        "7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f",
        "codeshell",
    ),
];

/// What a Hugging Face folder's GGUF metadata is made from.
#[derive(Clone, Copy)]
pub struct HfGgufSource<'a> {
    /// The folder (for `tokenizer.json`, `tokenizer_config.json`, `config.json` and the name).
    pub dir: &'a Path,
    pub config_json: &'a Value,
    /// The config as Pagoda parsed `config.json`.
    pub cfg: &'a ModelConfig,
    /// Pagoda's tokenizer of the folder (the pre-tokenizer hash and BOS/EOS behaviour).
    pub tokenizer: &'a Tokenizer,
    pub chat_template: Option<&'a str>,
}

fn invalid(message: String) -> CompressError {
    CompressError::InvalidInput(message)
}

/// The GGUF architecture name of `arch` for a file written from a Hugging Face folder.
pub fn gguf_arch_name(arch: Architecture) -> Result<&'static str, CompressError> {
    let family = arch.family();
    if family.split_fused.is_some() {
        return Err(invalid(format!(
            "GGUF output of a {} model is not supported yet: llama.cpp reads its Q/K/V and \
             gate/up projections fused, and Pagoda splits them when it opens the model",
            family.display
        )));
    }
    if family.hf_norm_offset != 0.0 {
        return Err(invalid(format!(
            "GGUF output from a {0} Hugging Face folder is not supported yet (llama.cpp \
             stores its norms with the +1 folded in and a SentencePiece vocabulary with \
             scores); quantize a {0} GGUF instead, or write a folder (--format gptq/awq)",
            family.display
        )));
    }
    Ok(family.gguf_name())
}

/// Every metadata key of the GGUF file (hyperparameters, then the tokenizer), in order.
pub fn hf_gguf_metadata(src: &HfGgufSource<'_>) -> Result<Vec<(String, GgufValue)>, CompressError> {
    let mut kv = hparams(src)?;
    kv.extend(tokenizer_metadata(src)?);
    Ok(kv)
}

/// `general.*` and `{arch}.*` keys.
fn hparams(src: &HfGgufSource<'_>) -> Result<Vec<(String, GgufValue)>, CompressError> {
    let cfg = src.cfg;
    if let Some(why) = cfg.irregular_layers() {
        return Err(invalid(format!(
            "GGUF output from a {} Hugging Face folder is not supported yet: {why}; convert \
             it with llama.cpp's convert_hf_to_gguf.py",
            cfg.arch.family().display
        )));
    }
    let a = gguf_arch_name(cfg.arch)?;
    let u32_of = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| invalid(format!("config.json: {what} {v} does not fit GGUF")))
    };
    let name = src
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.to_string());
    let mut kv: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::String(a.into())),
        ("general.name".into(), GgufValue::String(name)),
    ];
    let mut put = |k: &str, v: GgufValue| kv.push((format!("{a}.{k}"), v));
    put(
        "context_length",
        GgufValue::U32(u32_of("context length", cfg.context_length)?),
    );
    put(
        "embedding_length",
        GgufValue::U32(u32_of("hidden_size", cfg.hidden_size)?),
    );
    put(
        "block_count",
        GgufValue::U32(u32_of("num_hidden_layers", cfg.n_layers)?),
    );
    put(
        "feed_forward_length",
        GgufValue::U32(u32_of("intermediate_size", cfg.ffn_dim)?),
    );
    put(
        "attention.head_count",
        GgufValue::U32(u32_of("num_attention_heads", cfg.n_heads)?),
    );
    put(
        "attention.head_count_kv",
        GgufValue::U32(u32_of("num_key_value_heads", cfg.n_kv_heads)?),
    );
    put(
        "attention.layer_norm_rms_epsilon",
        GgufValue::F32(cfg.rms_eps),
    );
    put("rope.freq_base", GgufValue::F32(cfg.rope_theta));
    put(
        "rope.dimension_count",
        GgufValue::U32(u32_of("rotary dimension", cfg.rope_dim)?),
    );
    put(
        "vocab_size",
        GgufValue::U32(u32_of("vocab_size", cfg.vocab_size)?),
    );
    if src
        .config_json
        .get("head_dim")
        .is_some_and(|v| !v.is_null())
        || cfg.head_dim * cfg.n_heads != cfg.hidden_size
    {
        let hd = u32_of("head_dim", cfg.head_dim)?;
        put("attention.key_length", GgufValue::U32(hd));
        put("attention.value_length", GgufValue::U32(hd));
    }
    match cfg.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            put("rope.scaling.type", GgufValue::String("linear".into()));
            put("rope.scaling.factor", GgufValue::F32(factor));
        }
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            attention_factor,
            ..
        } => {
            put("rope.scaling.type", GgufValue::String("yarn".into()));
            put("rope.scaling.factor", GgufValue::F32(factor));
            put(
                "rope.scaling.original_context_length",
                GgufValue::U32(u32_of(
                    "original_max_position_embeddings",
                    original_max_position,
                )?),
            );
            put("rope.scaling.yarn_beta_fast", GgufValue::F32(beta_fast));
            put("rope.scaling.yarn_beta_slow", GgufValue::F32(beta_slow));
            // llama.cpp's temperature is get_mscale(f, 1) / get_mscale(f, m) for
            // `yarn_log_multiplier` m, get_mscale(f, 1) without it: write the m that gives
            // this checkpoint's factor when it is not the default.
            let default = yarn_mscale(factor, 1.0);
            if (attention_factor - default).abs() > 1e-6 && factor > 1.0 && attention_factor > 0.0 {
                let m = (default / attention_factor - 1.0) / (0.1 * factor.ln());
                put("rope.scaling.yarn_log_multiplier", GgufValue::F32(m));
            }
        }
        // Carried by the rope_freqs.weight tensor (in the families llama.cpp reads it for).
        RopeScaling::Llama3 { .. } if cfg.arch.family().gguf_rope_freqs => {}
        RopeScaling::LongRope { .. } => {
            return Err(invalid(format!(
                "config.json asks for LongRoPE, which Pagoda writes to GGUF {a} only as the \
                 per-layer factor tensors of its own family (not supported yet)"
            )))
        }
        RopeScaling::Llama3 { .. } => {
            return Err(invalid(format!(
                "config.json asks for Llama 3 RoPE scaling on a {a} model, which GGUF {a} \
                 cannot carry"
            )))
        }
    }
    if let Some(t) = cfg.query_temperature {
        // llama.cpp's `mistral3` floors positions by the YaRN original context.
        let orig = match cfg.rope_scaling {
            RopeScaling::Yarn {
                original_max_position,
                ..
            } => original_max_position,
            _ => usize::MAX,
        };
        if orig != t.original_context {
            return Err(invalid(format!(
                "the query temperature's context {} differs from the YaRN original context, \
                 which GGUF {a} cannot carry",
                t.original_context
            )));
        }
        put("attention.temperature_scale", GgufValue::F32(t.beta));
    }
    if cfg.sliding_window.is_some() {
        tracing::warn!(
            "config.json sets a sliding window; GGUF {a} has no sliding window for this \
             architecture, so the file attends over the whole context (as llama.cpp does)"
        );
    }
    Ok(kv)
}

/// llama.cpp's `rope_freqs.weight` for Llama 3 RoPE scaling: one divisor per frequency
/// (`rope_dim / 2`), computed as Pagoda's own Llama 3 scaling does, so that
/// `base / factor` is the scaled frequency. `None` without Llama 3 scaling.
pub fn llama3_rope_factors(cfg: &ModelConfig) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position,
    } = cfg.rope_scaling
    else {
        return None;
    };
    let dim = cfg.rope_dim;
    let old = original_max_position as f32;
    let low_wavelen = old / low_freq_factor;
    let high_wavelen = old / high_freq_factor;
    Some(
        (0..dim / 2)
            .map(|i| {
                let f = 1.0 / (cfg.rope_theta as f64).powf(2.0 * i as f64 / dim as f64) as f32;
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect(),
    )
}

fn read_json(path: &Path) -> Result<Option<Value>, CompressError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes =
        std::fs::read(path).map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| invalid(format!("{}: not valid JSON: {e}", path.display())))
}

/// A byte-level BPE vocabulary as GGUF holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufVocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
}

/// `tokenizer.ggml.*` and `tokenizer.chat_template`.
fn tokenizer_metadata(src: &HfGgufSource<'_>) -> Result<Vec<(String, GgufValue)>, CompressError> {
    let tj_path = src.dir.join("tokenizer.json");
    let tj = read_json(&tj_path)?.ok_or_else(|| {
        invalid(format!(
            "{} has no tokenizer.json: GGUF output needs the vocabulary; add the model's \
             tokenizer.json to the folder",
            src.dir.display()
        ))
    })?;
    let vocab = byte_level_vocab(src.dir, &tj, src.cfg.vocab_size, src.tokenizer)?;
    let tc = read_json(&src.dir.join("tokenizer_config.json"))?;
    let gen = read_json(&src.dir.join("generation_config.json"))?;
    let n = vocab.tokens.len();
    let mut kv: Vec<(String, GgufValue)> = vec![
        (
            "tokenizer.ggml.model".into(),
            GgufValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            GgufValue::String(vocab.pre.into()),
        ),
    ];
    let by_text: HashMap<&str, u32> = vocab
        .tokens
        .iter()
        .enumerate()
        .rev() // the first id of a repeated token wins
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let text_of = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
            _ => None,
        }
    };
    let id_from = |cfg: Option<&Value>, key: &str| -> Option<u32> {
        match cfg?.get(key)? {
            Value::Number(x) => x.as_u64().and_then(|x| u32::try_from(x).ok()),
            Value::Array(a) => a.first()?.as_u64().and_then(|x| u32::try_from(x).ok()),
            _ => None,
        }
    };
    let mut specials: Vec<(&str, u32)> = Vec::new();
    for typ in ["bos", "eos", "unk", "sep", "pad", "cls", "mask"] {
        let from_text = tc
            .as_ref()
            .and_then(|c| c.get(format!("{typ}_token")))
            .and_then(text_of)
            .and_then(|t| by_text.get(t.as_str()).copied());
        let key = format!("{typ}_token_id");
        let id = from_text
            .or_else(|| id_from(Some(src.config_json), &key))
            .or_else(|| id_from(gen.as_ref(), &key));
        if let Some(id) = id.filter(|&id| (id as usize) < n) {
            specials.push((typ, id));
        }
    }
    kv.push((
        "tokenizer.ggml.tokens".into(),
        GgufValue::Array(GgufArray::String(vocab.tokens)),
    ));
    kv.push((
        "tokenizer.ggml.token_type".into(),
        GgufValue::Array(GgufArray::I32(vocab.types)),
    ));
    kv.push((
        "tokenizer.ggml.merges".into(),
        GgufValue::Array(GgufArray::String(vocab.merges)),
    ));
    for (typ, id) in specials {
        let name = match typ {
            "unk" => "unknown",
            "sep" => "seperator", // sic: llama.cpp's key
            "pad" => "padding",
            other => other,
        };
        kv.push((
            format!("tokenizer.ggml.{name}_token_id"),
            GgufValue::U32(id),
        ));
    }
    // As the folder's tokenizer behaves in Pagoda (post-processor and add_bos_token).
    let probe = "a";
    let with = src.tokenizer.encode(probe, true)?;
    let without = src.tokenizer.encode(probe, false)?;
    let add_bos = src
        .tokenizer
        .bos_id()
        .is_some_and(|b| with.first() == Some(&b) && without.first() != Some(&b));
    let add_eos = with.len() > without.len()
        && with
            .last()
            .is_some_and(|e| src.tokenizer.eos_ids().contains(e))
        && with.last() != without.last();
    kv.push((
        "tokenizer.ggml.add_bos_token".into(),
        GgufValue::Bool(add_bos),
    ));
    kv.push((
        "tokenizer.ggml.add_eos_token".into(),
        GgufValue::Bool(add_eos),
    ));
    if let Some(t) = src.chat_template {
        kv.push((
            "tokenizer.chat_template".into(),
            GgufValue::String(t.into()),
        ));
    }
    Ok(kv)
}

/// Whether an added token looks like a control token although not marked special (llama.cpp's
/// `does_token_look_special`).
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// The vocabulary of a byte-level BPE `tokenizer.json` (`tj`) padded to `vocab_size`, with
/// its pre-tokenizer name; other tokenizers are refused (see the module doc).
pub fn byte_level_vocab(
    dir: &Path,
    tj: &Value,
    vocab_size: usize,
    tokenizer: &Tokenizer,
) -> Result<GgufVocab, CompressError> {
    let path = dir.join("tokenizer.json");
    let model = tj
        .get("model")
        .ok_or_else(|| invalid(format!("{}: no \"model\" object", path.display())))?;
    let ty = model.get("type").and_then(Value::as_str).unwrap_or("");
    let spm = dir.join("tokenizer.model").is_file()
        || model.get("byte_fallback").and_then(Value::as_bool) == Some(true)
        || ["pre_tokenizer", "decoder", "normalizer"].iter().any(|k| {
            tj.get(k)
                .is_some_and(|v| v.to_string().contains("\"Metaspace\""))
        });
    if spm {
        return Err(invalid(format!(
            "{}: a SentencePiece vocabulary (byte fallback / Metaspace{}); GGUF output writes \
             byte-level BPE (gpt2) vocabularies only for now: quantize a GGUF of this model \
             instead, or write a folder (--format gptq/awq)",
            path.display(),
            if dir.join("tokenizer.model").is_file() {
                ", tokenizer.model"
            } else {
                ""
            }
        )));
    }
    if ty != "BPE" {
        return Err(invalid(format!(
            "{}: tokenizer model {ty:?} is not supported for GGUF output (byte-level BPE only)",
            path.display()
        )));
    }
    let pre = pre_tokenizer_name(&path, tj, tokenizer)?;
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid(format!("{}: no model.vocab object", path.display())))?;
    let mut by_id: Vec<Option<String>> = vec![None; vocab_size];
    let mut types = vec![TOKEN_UNUSED; vocab_size];
    let out_of_range = |t: &str, id: u64| {
        invalid(format!(
            "{}: token {t:?} has id {id}, outside config.json's vocab_size {vocab_size}",
            path.display()
        ))
    };
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| invalid(format!("{}: id of {t:?} is not a number", path.display())))?;
        let slot = by_id
            .get_mut(id as usize)
            .ok_or_else(|| out_of_range(t, id))?;
        *slot = Some(t.clone());
        types[id as usize] = TOKEN_NORMAL;
    }
    for a in tj
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(content)) = (
            a.get("id").and_then(Value::as_u64),
            a.get("content").and_then(Value::as_str),
        ) else {
            continue;
        };
        let special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let slot = by_id
            .get_mut(id as usize)
            .ok_or_else(|| out_of_range(content, id))?;
        if special || looks_special(content) {
            *slot = Some(content.to_string());
            types[id as usize] = TOKEN_CONTROL;
        } else {
            *slot = Some(content.replace('\u{2581}', " "));
            types[id as usize] = TOKEN_USER_DEFINED;
        }
    }
    let tokens = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    let merges = match model.get("merges").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .map(|m| match m {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 => {
                    // Spaces inside a part are written as U+0120, as llama.cpp's converter does.
                    let part = |v: &Value| v.as_str().map(|s| s.replace(' ', "\u{120}"));
                    match (part(&p[0]), part(&p[1])) {
                        (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                        _ => Err(invalid(format!("{}: bad merge {m}", path.display()))),
                    }
                }
                _ => Err(invalid(format!("{}: bad merge {m}", path.display()))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    if merges.is_empty() {
        return Err(invalid(format!(
            "{}: byte-level BPE without merges",
            path.display()
        )));
    }
    Ok(GgufVocab {
        tokens,
        types,
        merges,
        pre,
    })
}

/// `tokenizer.ggml.pre` for `tj`: llama.cpp's hash of the check text's ids when it is a
/// published vocabulary, else the pre-tokenizer's shape (see the module doc).
pub fn pre_tokenizer_name(
    path: &Path,
    tj: &Value,
    tokenizer: &Tokenizer,
) -> Result<&'static str, CompressError> {
    let ids = tokenizer
        .inner()
        .encode(CHECK_TEXT, true)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let text = format!("{:?}", ids.get_ids());
    let hash = Sha256::digest(text.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    if let Some((_, name)) = KNOWN_PRE_HASHES.iter().find(|(h, _)| *h == hex) {
        return Ok(name);
    }
    let pre = tj.get("pre_tokenizer").unwrap_or(&Value::Null);
    if let Some(name) = pre_by_shape(pre) {
        tracing::info!(
            "{}: pre-tokenizer not among llama.cpp's published hashes ({hex}); its shape is \
             llama.cpp's {name:?}",
            path.display()
        );
        return Ok(name);
    }
    Err(invalid(format!(
        "{}: the pre-tokenizer {pre} is not one llama.cpp and Pagoda both implement \
         (gpt-2, smollm, qwen2, llama-bpe); GGUF output cannot reproduce its tokenization",
        path.display()
    )))
}

/// The pre-tokenizer name for a `tokenizer.json` `pre_tokenizer` of a known shape.
fn pre_by_shape(pre: &Value) -> Option<&'static str> {
    let ty = |v: &Value| v.get("type").and_then(Value::as_str).map(String::from);
    let byte_level = |v: &Value, regex: bool| {
        ty(v).as_deref() == Some("ByteLevel")
            && v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == regex
            && !v
                .get("add_prefix_space")
                .and_then(Value::as_bool)
                .unwrap_or(false)
    };
    if byte_level(pre, true) {
        return Some("gpt-2");
    }
    let parts = pre.get("pretokenizers").and_then(Value::as_array)?;
    match parts.as_slice() {
        [d, b] if ty(d).as_deref() == Some("Digits") && byte_level(b, true) => {
            let single = d
                .get("individual_digits")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            single.then_some("smollm")
        }
        [s, b] if ty(s).as_deref() == Some("Split") && byte_level(b, false) => {
            let re = s.get("pattern")?.get("Regex")?.as_str()?;
            if re == QWEN2_REGEX {
                Some("qwen2")
            } else if re == LLAMA3_REGEX {
                Some("llama-bpe")
            } else {
                None
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pre_tokenizer_shapes() {
        assert_eq!(
            pre_by_shape(
                &json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})
            ),
            Some("gpt-2")
        );
        assert_eq!(
            pre_by_shape(&json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]})),
            Some("smollm")
        );
        assert_eq!(
            pre_by_shape(&json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated"},
                {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})),
            Some("qwen2")
        );
        assert_eq!(
            pre_by_shape(&json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated"},
                {"type": "ByteLevel", "use_regex": false}]})),
            None
        );
        assert_eq!(pre_by_shape(&json!({"type": "Metaspace"})), None);
    }

    #[test]
    fn special_looking_tokens() {
        assert!(looks_special("<|im_start|>"));
        assert!(looks_special("<pad>"));
        assert!(!looks_special("hello"));
    }

    #[test]
    fn llama3_factors_follow_the_wavelength_bands() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
        let json: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        // head_dim 16, theta 10 000, llama3 factor 8 over an original context of 64.
        let mut cfg = ModelConfig::from_hf_config(&json).unwrap();
        let f = llama3_rope_factors(&cfg).unwrap();
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0); // highest frequency: unscaled
        assert_eq!(f[7], 8.0); // lowest: divided by the factor
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
        cfg.rope_scaling = RopeScaling::None;
        assert!(llama3_rope_factors(&cfg).is_none());
    }
}
