//! Hugging Face model folders: `config.json`, `model.safetensors` or sharded
//! `model-0000x-of-0000y.safetensors` + `model.safetensors.index.json`, `tokenizer.json`,
//! `tokenizer_config.json` (chat template, BOS/EOS, `add_bos_token`), `chat_template.jinja`,
//! `generation_config.json`.
//!
//! Owns mapping HF tensor names onto the canonical GGUF names ([`canonical_name`]).
//! Invariants: every tensor of every shard is validated by [`SafetensorsFile`]; two source
//! names that map to one canonical name are an error, never a silent overwrite; a folder
//! without `tokenizer.json` is an error naming the folder. A GPTQ/AWQ checkpoint's packed
//! linear layers are converted by `hf_quant.rs`, an MXFP4 checkpoint's (gpt-oss) blocks by
//! `hf_mxfp4.rs`, and then mapped like any other tensor. A PEFT
//! adapter folder or a bitsandbytes (QLoRA) checkpoint is refused with the way to serve it
//! (merge, then quantize: [`crate::lora::MERGE_THEN_QUANTIZE`]).

use crate::chat_template::ChatTemplate;
use crate::config::Architecture;
use crate::family::NormPlacement;
use crate::hf_quant::{split_part, CheckpointQuant, CheckpointQuantReport, Part, QuantLinears};
use crate::safetensors::SafetensorsFile;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What an HF folder holds, parsed.
#[derive(Debug)]
pub struct HfFolder {
    pub path: PathBuf,
    pub config_json: Value,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub generation_config: Option<Value>,
    /// Bytes of all safetensors shards.
    pub weights_file_size: u64,
    /// What loading a GPTQ/AWQ checkpoint did; `None` for an unquantized folder.
    pub checkpoint_quant: Option<CheckpointQuantReport>,
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ModelError::Format {
        path: path.to_path_buf(),
        message: format!("not valid JSON: {e}"),
    })
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, ModelError> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// The canonical (GGUF) name of HF tensor `name`, or `None` for tensors a text model does not
/// use (vision tower, projector, rotary caches).
pub fn canonical_name(name: &str, arch: Architecture) -> Option<String> {
    let mut n = name;
    for prefix in [
        "model.language_model.",
        "language_model.model.",
        "language_model.",
        "model.",
    ] {
        if let Some(rest) = n.strip_prefix(prefix) {
            n = rest;
            break;
        }
    }
    if n.starts_with("vision_tower.")
        || n.starts_with("vision_model.")
        || n.starts_with("multi_modal_projector.")
        || name.starts_with("model.vision_tower.")
        || name.starts_with("model.multi_modal_projector.")
        || n.ends_with("rotary_emb.inv_freq")
    {
        return None;
    }
    match n {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        // Gemma 4's per-layer embeddings.
        "embed_tokens_per_layer.weight" => return Some("per_layer_token_embd.weight".into()),
        "per_layer_model_projection.weight" => return Some("per_layer_model_proj.weight".into()),
        "per_layer_projection_norm.weight" => return Some("per_layer_proj_norm.weight".into()),
        _ => {}
    }
    let Some(rest) = n.strip_prefix("layers.") else {
        return Some(n.to_string());
    };
    let Some((layer, sub)) = rest.split_once('.') else {
        return Some(n.to_string());
    };
    if layer.parse::<usize>().is_err() {
        return Some(n.to_string());
    }
    if let Some(name) = expert_tensor(layer, sub) {
        return Some(name);
    }
    let gemma = arch.family().block.norms == NormPlacement::Sandwich;
    match LAYER_NAMES
        .iter()
        .find(|(hf, _, only)| *hf == sub && only.is_none_or(|g| g == gemma))
    {
        Some((_, gguf, _)) => Some(format!("blk.{layer}.{gguf}")),
        None => Some(format!("blk.{layer}.{sub}")),
    }
}

/// The canonical name of a mixture-of-experts tensor of layer `layer`: the router
/// (`mlp.gate.weight`) and its selection bias (`mlp.gate.e_score_correction_bias`), per-expert
/// projections (`mlp.experts.{e}.{gate,up,down}_proj.weight`), and the shared expert
/// (`mlp.shared_expert{,s}.*_proj.weight`, its gate `mlp.shared_expert_gate.weight`), as
/// `family::moe` names them.
fn expert_tensor(layer: &str, sub: &str) -> Option<String> {
    match sub {
        "mlp.gate.weight" | "mlp.router.weight" => {
            return Some(format!("blk.{layer}.ffn_gate_inp.weight"))
        }
        "mlp.router.bias" => return Some(format!("blk.{layer}.ffn_gate_inp.bias")),
        "mlp.shared_expert_gate.weight" => {
            return Some(format!("blk.{layer}.ffn_gate_inp_shexp.weight"))
        }
        "mlp.gate.e_score_correction_bias" => return Some(format!("blk.{layer}.exp_probs_b.bias")),
        _ => {}
    }
    if let Some(proj) = sub
        .strip_prefix("mlp.shared_expert.")
        .or_else(|| sub.strip_prefix("mlp.shared_experts."))
        .and_then(|p| p.strip_suffix("_proj.weight"))
    {
        return matches!(proj, "gate" | "up" | "down")
            .then(|| format!("blk.{layer}.ffn_{proj}_shexp.weight"));
    }
    let rest = sub.strip_prefix("mlp.experts.")?;
    let (e, proj) = rest.split_once('.')?;
    let e: usize = e.parse().ok()?;
    let proj = proj.strip_suffix("_proj.weight")?;
    matches!(proj, "gate" | "up" | "down").then(|| format!("blk.{layer}.ffn_{proj}_exp.{e}.weight"))
}

/// Per-layer HF tensor suffixes and their GGUF names, both directions' one table; the third
/// field restricts an entry to families with sandwich norms (`Some(true)`: Gemma's
/// `post_attention_layernorm` is a post-norm) or to the others (`Some(false)`: it is the
/// MLP's pre-norm).
const LAYER_NAMES: [(&str, &str, Option<bool>); 25] = [
    ("self_attn.q_proj.weight", "attn_q.weight", None),
    ("self_attn.k_proj.weight", "attn_k.weight", None),
    ("self_attn.v_proj.weight", "attn_v.weight", None),
    ("self_attn.o_proj.weight", "attn_output.weight", None),
    ("self_attn.q_proj.bias", "attn_q.bias", None),
    ("self_attn.k_proj.bias", "attn_k.bias", None),
    ("self_attn.v_proj.bias", "attn_v.bias", None),
    ("self_attn.o_proj.bias", "attn_output.bias", None),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", None),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", None),
    ("input_layernorm.weight", "attn_norm.weight", None),
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
        Some(true),
    ),
    (
        "post_attention_layernorm.weight",
        "ffn_norm.weight",
        Some(false),
    ),
    (
        "pre_feedforward_layernorm.weight",
        "ffn_norm.weight",
        Some(true),
    ),
    (
        "post_feedforward_layernorm.weight",
        "post_ffw_norm.weight",
        None,
    ),
    ("mlp.gate_proj.weight", "ffn_gate.weight", None),
    ("mlp.up_proj.weight", "ffn_up.weight", None),
    ("mlp.down_proj.weight", "ffn_down.weight", None),
    // Phi-3's fused projections, named as llama.cpp's converter names them (split into the
    // entries above when the model is opened: `family::prepare_weights`).
    ("self_attn.qkv_proj.weight", "attn_qkv.weight", None),
    ("mlp.gate_up_proj.weight", "ffn_up.weight", None),
    // Gemma 4: the per-layer input's gate, projection and norm, and the layer's output scale.
    ("per_layer_input_gate.weight", "inp_gate.weight", None),
    ("per_layer_projection.weight", "proj.weight", None),
    ("post_per_layer_input_norm.weight", "post_norm.weight", None),
    ("layer_scalar", "layer_output_scale.weight", None),
    // gpt-oss's attention sinks.
    ("self_attn.sinks", "attn_sinks.weight", None),
];

/// The Hugging Face (transformers `*ForCausalLM`) name of canonical tensor `canonical`: the
/// inverse of [`canonical_name`] for the text-model tensors it maps; `None` for a name it
/// does not know.
pub fn hf_name(canonical: &str, arch: Architecture) -> Option<String> {
    match canonical {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = canonical.strip_prefix("blk.")?;
    let (layer, sub) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let gemma = arch.family().block.norms == NormPlacement::Sandwich;
    LAYER_NAMES
        .iter()
        .find(|(_, gguf, only)| *gguf == sub && only.is_none_or(|g| g == gemma))
        .map(|(hf, _, _)| format!("model.layers.{layer}.{hf}"))
}

/// The safetensors files of a folder: from the index when there is one, else `model.safetensors`,
/// else every `*.safetensors` file in name order.
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let v = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::Format {
                path: index.clone(),
                message: "no \"weight_map\" object".into(),
            })?;
        let mut files = BTreeSet::new();
        for (tensor, file) in map {
            let f = file.as_str().ok_or_else(|| ModelError::Format {
                path: index.clone(),
                message: format!("weight_map entry for {tensor:?} is not a file name"),
            })?;
            if f.contains('/') || f.contains('\\') || f.contains("..") {
                return Err(ModelError::Format {
                    path: index.clone(),
                    message: format!("weight_map names {f:?}, which is not a file in this folder"),
                });
            }
            files.insert(f.to_string());
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| ModelError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(ModelError::Format {
            path: dir.to_path_buf(),
            message: "no model.safetensors, model.safetensors.index.json or *.safetensors file in the folder".into(),
        });
    }
    Ok(found)
}

/// The chat template of a folder: `chat_template.jinja`, `chat_template.json`, or
/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of which
/// `default` is taken).
fn find_chat_template(
    dir: &Path,
    tokenizer_config: Option<&Value>,
) -> Result<Option<String>, ModelError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| ModelError::Io {
                path: jinja,
                source,
            });
    }
    let from_value = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(String::from),
            _ => None,
        }
    };
    if let Some(v) = read_json_opt(&dir.join("chat_template.json"))? {
        if let Some(t) = v.get("chat_template").and_then(from_value) {
            return Ok(Some(t));
        }
    }
    Ok(tokenizer_config
        .and_then(|c| c.get("chat_template"))
        .and_then(from_value))
}

impl HfFolder {
    /// Opens the folder at `dir`.
    pub fn open(dir: &Path) -> Result<HfFolder, ModelError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            if dir.join("adapter_config.json").is_file() {
                return Err(ModelError::Format {
                    path: dir.to_path_buf(),
                    message: format!(
                        "this is a PEFT LoRA adapter (adapter_config.json, no config.json), not a \
                         model: it only holds the changes to a base model. To serve the \
                         fine-tune, {}",
                        crate::lora::MERGE_THEN_QUANTIZE
                    ),
                });
            }
            return Err(ModelError::Format {
                path: dir.to_path_buf(),
                message: "not a model folder: no config.json".into(),
            });
        }
        let config_json = read_json(&config_path)?;
        if let Some(q) = config_json.get("quantization_config") {
            if crate::lora::is_bitsandbytes(q) {
                return Err(ModelError::Format {
                    path: config_path,
                    message: format!(
                        "quantization_config is bitsandbytes (load_in_4bit / NF4: a QLoRA \
                         training checkpoint), whose packed weights Pagoda does not read. To \
                         serve the fine-tune, {}",
                        crate::lora::MERGE_THEN_QUANTIZE
                    ),
                });
            }
        }
        let config = ModelConfig::from_hf_config(&config_json).map_err(|e| match e {
            ModelError::InvalidConfig(m) => ModelError::Format {
                path: config_path.clone(),
                message: m,
            },
            ModelError::UnknownArchitecture(a) => ModelError::UnsupportedArchitecture {
                path: config_path.clone(),
                arch: a,
            },
            other => other,
        })?;

        // MXFP4 (gpt-oss) keeps its blocks as they are; GPTQ/AWQ linears are converted.
        let mxfp4 = crate::hf_mxfp4::is_mxfp4(config_json.get("quantization_config"));
        let mut mxfp4_tensors = crate::hf_mxfp4::Mxfp4Tensors::default();
        let scheme = if mxfp4 {
            None
        } else {
            CheckpointQuant::from_folder(dir, &config_json)?
        };
        let mut weights = Weights::new();
        let mut weights_file_size = 0u64;
        let mut sources: std::collections::HashMap<String, (String, PathBuf)> = Default::default();
        let mut quantized = QuantLinears::default();
        let mut insert =
            |mut view: crate::weights::TensorView, shard: &Path| -> Result<(), ModelError> {
                let Some(canon) = canonical_name(&view.name, config.arch) else {
                    return Ok(());
                };
                if let Some((other, other_file)) = sources.get(&canon) {
                    return Err(ModelError::Tensor {
                        path: shard.to_path_buf(),
                        tensor: view.name.clone(),
                        message: format!(
                            "maps to {canon:?}, as does {other:?} in {}",
                            other_file.display()
                        ),
                    });
                }
                sources.insert(canon.clone(), (view.name.clone(), shard.to_path_buf()));
                view.name = canon;
                weights.insert(view).map_err(|message| ModelError::Format {
                    path: shard.to_path_buf(),
                    message,
                })
            };
        for shard in shard_paths(dir)? {
            let file = if scheme.is_some() || mxfp4 {
                // Packed weights are I32 (GPTQ/AWQ) or U8 (MXFP4) tensors.
                SafetensorsFile::open_skipping_unsupported(&shard)?
            } else {
                SafetensorsFile::open(&shard)?
            };
            weights_file_size += std::fs::metadata(&shard).map(|m| m.len()).unwrap_or(0);
            let (views, raws) = file.into_parts();
            for view in views {
                if scheme.is_some() && split_part(&view.name).is_some() {
                    let name = view.name.clone();
                    quantized.add(&name, Part::Float(view, shard.clone()))?;
                    continue;
                }
                insert(view, &shard)?;
            }
            for raw in raws {
                if mxfp4 {
                    mxfp4_tensors.add(raw, &shard)?;
                    continue;
                }
                if split_part(&raw.name).is_some() {
                    let name = raw.name.clone();
                    quantized.add(&name, Part::Int(raw, shard.clone()))?;
                }
                // Other integer buffers (position ids and the like) are not weights.
            }
        }
        for (view, shard) in mxfp4_tensors.convert()? {
            insert(view, &shard)?;
        }
        let checkpoint_quant = match &scheme {
            Some(scheme) => {
                let (views, report) = quantized.convert(scheme, dir)?;
                for (view, shard) in views {
                    insert(view, &shard)?;
                }
                let mut report = report;
                report.weight_bytes = weights.iter().map(|t| t.n_bytes() as u64).sum();
                tracing::info!(path = %dir.display(), "{report}");
                Some(report)
            }
            None => None,
        };
        crate::family::prepare_weights(&config, &mut weights)?;
        let mut config = config;
        if !weights.contains("output.weight") {
            config.tie_word_embeddings = true;
        }

        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(ModelError::TokenizerFile {
                path: dir.to_path_buf(),
                message: "no tokenizer.json in the model folder".into(),
            });
        }
        let tokenizer_config = read_json_opt(&dir.join("tokenizer_config.json"))?;
        let generation_config = read_json_opt(&dir.join("generation_config.json"))?;
        let tokenizer = Tokenizer::from_hf_files(
            &tok_path,
            tokenizer_config.as_ref(),
            generation_config.as_ref(),
            Some(&config_json),
        )?;
        let chat_template = match find_chat_template(dir, tokenizer_config.as_ref())? {
            Some(src) => Some(
                ChatTemplate::new(
                    src,
                    tokenizer.bos_token().unwrap_or("").to_string(),
                    tokenizer.eos_token().unwrap_or("").to_string(),
                )
                .map_err(|e| ModelError::Format {
                    path: dir.to_path_buf(),
                    message: e.to_string(),
                })?,
            ),
            None => None,
        };
        Ok(HfFolder {
            path: dir.to_path_buf(),
            config_json,
            config,
            weights,
            tokenizer,
            chat_template,
            generation_config,
            weights_file_size,
            checkpoint_quant,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_shared_expert_and_router_bias_names() {
        let a = Architecture::Qwen2Moe;
        for (hf, gguf) in [
            (
                "model.layers.2.mlp.shared_expert.gate_proj.weight",
                "blk.2.ffn_gate_shexp.weight",
            ),
            (
                "model.layers.2.mlp.shared_expert.down_proj.weight",
                "blk.2.ffn_down_shexp.weight",
            ),
            (
                "model.layers.0.mlp.shared_experts.up_proj.weight",
                "blk.0.ffn_up_shexp.weight",
            ),
            (
                "model.layers.1.mlp.shared_expert_gate.weight",
                "blk.1.ffn_gate_inp_shexp.weight",
            ),
            (
                "model.layers.1.mlp.gate.e_score_correction_bias",
                "blk.1.exp_probs_b.bias",
            ),
            (
                "model.layers.1.mlp.experts.7.up_proj.weight",
                "blk.1.ffn_up_exp.7.weight",
            ),
        ] {
            assert_eq!(canonical_name(hf, a).as_deref(), Some(gguf), "{hf}");
        }
    }

    #[test]
    fn maps_hf_names() {
        let l = Architecture::Llama;
        let g = Architecture::Gemma3;
        assert_eq!(
            canonical_name("model.embed_tokens.weight", l).unwrap(),
            "token_embd.weight"
        );
        assert_eq!(
            canonical_name("lm_head.weight", l).unwrap(),
            "output.weight"
        );
        assert_eq!(
            canonical_name("model.norm.weight", l).unwrap(),
            "output_norm.weight"
        );
        assert_eq!(
            canonical_name("model.layers.3.self_attn.q_proj.bias", Architecture::Qwen2).unwrap(),
            "blk.3.attn_q.bias"
        );
        assert_eq!(
            canonical_name("model.layers.0.post_attention_layernorm.weight", l).unwrap(),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(
            canonical_name(
                "language_model.model.layers.0.post_attention_layernorm.weight",
                g
            )
            .unwrap(),
            "blk.0.post_attention_norm.weight"
        );
        assert_eq!(
            canonical_name(
                "model.language_model.layers.1.pre_feedforward_layernorm.weight",
                g
            )
            .unwrap(),
            "blk.1.ffn_norm.weight"
        );
        assert_eq!(
            canonical_name("model.layers.1.self_attn.k_norm.weight", g).unwrap(),
            "blk.1.attn_k_norm.weight"
        );
        assert_eq!(canonical_name("vision_tower.x.weight", g), None);
        for (hf, arch) in [
            ("model.embed_tokens.weight", l),
            ("lm_head.weight", l),
            ("model.norm.weight", l),
            ("model.layers.3.self_attn.q_proj.bias", Architecture::Qwen2),
            ("model.layers.0.post_attention_layernorm.weight", l),
            ("model.layers.0.post_attention_layernorm.weight", g),
            ("model.layers.1.pre_feedforward_layernorm.weight", g),
            ("model.layers.2.mlp.down_proj.weight", l),
        ] {
            let canon = canonical_name(hf, arch).unwrap();
            assert_eq!(hf_name(&canon, arch).as_deref(), Some(hf), "{canon}");
        }
        assert_eq!(hf_name("blk.x.attn_q.weight", l), None);
        assert_eq!(
            canonical_name("model.layers.0.self_attn.rotary_emb.inv_freq", l),
            None
        );
    }
}
