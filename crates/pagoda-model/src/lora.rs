//! PEFT LoRA adapters: reads a folder written by `peft`'s `save_pretrained`
//! (`adapter_config.json` + `adapter_model.safetensors`) and merges an adapter into base
//! weights (`W += scaling · B·A`, what `merge_and_unload` does).
//!
//! Owns: [`LoraConfig`] (the options that change the arithmetic; unknown fields are ignored,
//! options Pagoda cannot honour — `bias` other than `"none"`, `lora_bias`, DoRA,
//! `modules_to_save`, a non-LORA `peft_type`, regex keys in `rank_pattern`/`alpha_pattern` —
//! are errors naming them), [`LoraAdapter`] (the pairs of the file, as f32) and the merge.
//!
//! Also owns what a user is told when they try to load a fine-tuning artefact as a model
//! ([`MERGE_THEN_QUANTIZE`], [`is_bitsandbytes`]): an adapter folder or a bitsandbytes
//! (QLoRA) checkpoint is served by merging, then quantizing.
//!
//! Invariants:
//! - Module names are normalised to the Hugging Face module path of the base model
//!   (`model.layers.0.self_attn.q_proj`): PEFT's `base_model.model.` prefix and an adapter
//!   name (`lora_A.default.weight`) are removed.
//! - Every pair has `A: [r, in]`, `B: [out, r]` with the same `r`, equal to the config's rank
//!   for that module (`rank_pattern` first, then `r`); anything else is an error at open.
//! - The tensors of the file decide which modules are adapted. A list `target_modules` is
//!   checked against them (each adapted module's last name, or its whole path, must be listed);
//!   the string (regex) form is kept for messages only. `target_parameters` (peft's LoRA on a
//!   module's parameter, e.g. a transformers 5 MoE router's `gate.weight`) also names a module
//!   when the parameter is the module's `weight`, a 2-D matrix adapted as a linear's is; any
//!   other parameter (the fused 3-D expert weights `mlp.experts.gate_up_proj` / `down_proj`,
//!   whose pairs have rank `r · n_experts`) is an error naming the module.
//! - The merge never changes shapes: the base weight must be `[out, in]` (`[in, out]` with
//!   `fan_in_fan_out`, GPT-2's Conv1D layout), else an error; no input is unwrapped.

use crate::safetensors::SafetensorsFile;
use crate::ModelError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How to serve a LoRA or QLoRA fine-tune, for error messages: merge the adapter into the
/// unquantized base, then quantize the merged model.
pub const MERGE_THEN_QUANTIZE: &str = "merge the adapter into the unquantized base model, then \
quantize the merged model: `pagoda merge-lora BASE ADAPTER -o merged` (BASE: the original \
model as a GGUF file, a store name or a Hugging Face folder), then `pagoda quantize merged -o \
merged-q4.gguf` (a GGUF base), or quantize at load: `pagoda run merged --quantize nf4`";

/// Whether a config.json `quantization_config` is bitsandbytes' (`quant_method:
/// "bitsandbytes"`, or the older `load_in_4bit` / `load_in_8bit` flags): the 4-bit NF4 (or
/// 8-bit) weights QLoRA trains on, which Pagoda does not read.
pub fn is_bitsandbytes(quantization_config: &serde_json::Value) -> bool {
    let method = quantization_config
        .get("quant_method")
        .and_then(serde_json::Value::as_str)
        .map(str::to_ascii_lowercase);
    let flag = |k: &str| {
        quantization_config
            .get(k)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    method.as_deref() == Some("bitsandbytes")
        || (method.is_none() && (flag("load_in_4bit") || flag("load_in_8bit")))
}

/// `target_modules` as PEFT allows it: a list of module names, or one regex string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    /// A regex over module paths (or `"all-linear"`); not evaluated: the file's tensors decide.
    Pattern(String),
}

impl Default for TargetModules {
    fn default() -> Self {
        TargetModules::List(Vec::new())
    }
}

fn default_bias() -> String {
    "none".to_string()
}

/// The parts of `adapter_config.json` that matter to the merge.
#[derive(Debug, Clone, Deserialize)]
pub struct LoraConfig {
    pub r: usize,
    pub lora_alpha: f32,
    #[serde(default)]
    pub target_modules: Option<TargetModules>,
    /// peft's LoRA on parameters (`"<module>.<parameter>"`), for modules that are not
    /// `nn.Linear`: a transformers 5 MoE router (`gate.weight`) or fused experts
    /// (`mlp.experts.gate_up_proj`).
    #[serde(default)]
    pub target_parameters: Option<Vec<String>>,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    /// Scaling `alpha / sqrt(r)` instead of `alpha / r`.
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default = "default_bias")]
    pub bias: String,
    /// Per-module rank overrides: key → rank; a key names a module by its last names.
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, usize>,
    /// Per-module alpha overrides, keyed as `rank_pattern`.
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, f32>,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub lora_bias: bool,
    #[serde(default)]
    pub peft_type: Option<String>,
}

impl LoraConfig {
    /// Parses and validates `adapter_config.json`; `path` is only used in messages.
    pub fn from_json(path: &Path, text: &str) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.to_path_buf(),
            message,
        };
        let config: LoraConfig =
            serde_json::from_str(text).map_err(|e| fmt(format!("invalid adapter config: {e}")))?;
        if let Some(t) = &config.peft_type {
            if t != "LORA" {
                return Err(fmt(format!(
                    "peft_type {t:?} is not supported (only \"LORA\")"
                )));
            }
        }
        if config.r == 0 {
            return Err(fmt("r must be at least 1".into()));
        }
        if config.bias != "none" {
            return Err(fmt(format!(
                "bias {:?} is not supported (only \"none\": the adapter would also change biases)",
                config.bias
            )));
        }
        if config.lora_bias {
            return Err(fmt("lora_bias = true is not supported".into()));
        }
        if config.use_dora {
            return Err(fmt("use_dora = true (DoRA) is not supported".into()));
        }
        if let Some(m) = &config.modules_to_save {
            if !m.is_empty() {
                return Err(fmt(format!(
                    "modules_to_save {m:?} is not supported (fully trained modules in the adapter)"
                )));
            }
        }
        // peft writes regex keys of its own for the parameters it adapts (`.*\.gate_up_proj`);
        // such an adapter is refused by module once its tensors are read (`untargeted`), and the
        // keys are checked again after that (`LoraAdapter::from_parts`).
        if !config.adapts_parameters() {
            config.check_pattern_keys().map_err(fmt)?;
        }
        for (key, &r) in &config.rank_pattern {
            if r == 0 {
                return Err(fmt(format!(
                    "rank_pattern {key:?}: rank must be at least 1"
                )));
            }
        }
        Ok(config)
    }

    /// `rank_pattern` / `alpha_pattern` keys are plain module names, not regexes.
    fn check_pattern_keys(&self) -> Result<(), String> {
        let keys = self.rank_pattern.keys().chain(self.alpha_pattern.keys());
        for key in keys {
            if key.is_empty() || key.chars().any(|c| "*+?()[]{}|^$\\".contains(c)) {
                return Err(format!(
                    "rank_pattern/alpha_pattern key {key:?} is a regex; only plain module names are supported"
                ));
            }
        }
        Ok(())
    }

    /// The `target_parameters` entries as (owning module's name, possibly empty; parameter).
    fn parameter_targets(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.target_parameters.iter().flatten().map(|t| {
            let (owner, param) = t.rsplit_once('.').unwrap_or(("", t));
            (t.as_str(), owner, param)
        })
    }

    /// Whether `target_parameters` names a parameter other than a module's `weight`.
    fn adapts_parameters(&self) -> bool {
        self.parameter_targets()
            .any(|(_, _, param)| param != "weight")
    }

    /// The value of the one pattern key naming `module` (its whole path or its last names).
    fn pattern<T: Copy + PartialEq + std::fmt::Debug>(
        patterns: &BTreeMap<String, T>,
        module: &str,
    ) -> Result<Option<T>, String> {
        let mut found: Option<(&str, T)> = None;
        for (key, &v) in patterns {
            if module == key || module.ends_with(&format!(".{key}")) {
                if let Some((k0, v0)) = found {
                    if v0 != v {
                        return Err(format!(
                            "module {module}: pattern keys {k0:?} and {key:?} both match with different values"
                        ));
                    }
                }
                found = Some((key, v));
            }
        }
        Ok(found.map(|(_, v)| v))
    }

    /// The rank the config gives `module`.
    pub fn rank_for(&self, module: &str) -> Result<usize, String> {
        Ok(Self::pattern(&self.rank_pattern, module)?.unwrap_or(self.r))
    }

    /// `alpha / r`, or `alpha / sqrt(r)` with `use_rslora`, with the module's overrides.
    pub fn scaling_for(&self, module: &str) -> Result<f32, String> {
        let r = self.rank_for(module)? as f32;
        let alpha = Self::pattern(&self.alpha_pattern, module)?.unwrap_or(self.lora_alpha);
        Ok(if self.use_rslora {
            alpha / r.sqrt()
        } else {
            alpha / r
        })
    }

    /// Whether a list `target_modules` names `module` (`true` for the regex form), or
    /// `target_parameters` names its `weight`.
    fn targets(&self, module: &str) -> bool {
        let listed = match &self.target_modules {
            Some(TargetModules::List(list)) => list.iter().any(|t| names(module, t)),
            Some(TargetModules::Pattern(_)) | None => true,
        };
        listed
            || self
                .parameter_targets_of(module)
                .any(|(_, param)| param == "weight")
    }

    /// The `target_parameters` entries that may name a parameter of `module`, with their
    /// parameter: those whose owner names `module`, and bare parameter names (peft matches
    /// them in any module). peft saves a parameter's pair under its module; a second parameter
    /// of the same module nests one `base_layer` deeper (`mlp.experts.base_layer.lora_A`),
    /// which is dropped before matching.
    fn parameter_targets_of<'a>(
        &'a self,
        module: &str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let module = module.replace(".base_layer", "");
        self.parameter_targets()
            .filter(move |(_, owner, _)| owner.is_empty() || names(&module, owner))
            .map(|(t, _, param)| (t, param))
    }

    /// Why `module`, adapted in the file, is not an adapter Pagoda reads (see
    /// [`targets`](Self::targets)), or `None` when it is one.
    fn untargeted(&self, module: &str) -> Option<String> {
        if self.targets(module) {
            return None;
        }
        let params: Vec<&str> = self.parameter_targets_of(module).map(|(t, _)| t).collect();
        Some(if params.is_empty() {
            format!(
                "module {module} is not in target_modules {:?} (target_parameters {:?})",
                self.target_modules, self.target_parameters
            )
        } else if module.split('.').any(|part| part == "experts") {
            format!(
                "module {module} is adapted through target_parameters {params:?}: LoRA on the \
                 experts of a mixture-of-experts model is not supported (adapt the attention \
                 projections q_proj, k_proj, v_proj, o_proj)"
            )
        } else {
            format!(
                "module {module} is adapted through target_parameters {params:?}: LoRA on a \
                 parameter other than a module's 2-D weight is not supported"
            )
        })
    }
}

/// Whether `name` (a module's last names, or its whole path) names `module`.
fn names(module: &str, name: &str) -> bool {
    module == name
        || module
            .strip_suffix(name)
            .is_some_and(|head| head.ends_with('.'))
}

/// One adapted linear: `A: [r, in]`, `B: [out, r]` (row-major f32) and its scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    pub r: usize,
    pub in_features: usize,
    pub out_features: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub scaling: f32,
    /// The base weight is `[in, out]` (Conv1D) instead of `[out, in]`.
    pub fan_in_fan_out: bool,
}

impl LoraPair {
    /// The shape of the base weight this pair merges into.
    pub fn weight_shape(&self) -> [usize; 2] {
        if self.fan_in_fan_out {
            [self.in_features, self.out_features]
        } else {
            [self.out_features, self.in_features]
        }
    }

    /// `scaling · B·A` in the base weight's layout ([`weight_shape`](Self::weight_shape));
    /// zeros for a pair that is not [`is_consistent`](Self::is_consistent).
    pub fn delta(&self) -> Vec<f32> {
        let mut d = vec![0f32; self.out_features.saturating_mul(self.in_features)];
        add_scaled_product(&mut d, self, self.scaling);
        d
    }

    /// `A` is `[r, in]` and `B` is `[out, r]` (always so for pairs made by [`LoraAdapter`]).
    pub fn is_consistent(&self) -> bool {
        self.r.checked_mul(self.in_features) == Some(self.a.len())
            && self.out_features.checked_mul(self.r) == Some(self.b.len())
    }
}

/// `weight += scaling · B·A` in the pair's layout. Callers check the shapes; an inconsistent
/// pair or weight (or an empty one) leaves `weight` as it is instead of panicking.
fn add_scaled_product(weight: &mut [f32], pair: &LoraPair, scaling: f32) {
    let (r, n_in, n_out) = (pair.r, pair.in_features, pair.out_features);
    if !pair.is_consistent() || weight.is_empty() || n_in.checked_mul(n_out) != Some(weight.len()) {
        return;
    }
    if pair.fan_in_fan_out {
        // weight[i, o] += s · Σ_k A[k, i] B[o, k]
        for (i, row) in weight.chunks_exact_mut(n_out).enumerate() {
            for k in 0..r {
                let a = scaling * pair.a[k * n_in + i];
                for (o, w) in row.iter_mut().enumerate() {
                    *w += a * pair.b[o * r + k];
                }
            }
        }
    } else {
        // weight[o, :] += Σ_k (s · B[o, k]) A[k, :]
        for (o, row) in weight.chunks_exact_mut(n_in).enumerate() {
            for k in 0..r {
                let b = scaling * pair.b[o * r + k];
                for (w, a) in row.iter_mut().zip(&pair.a[k * n_in..(k + 1) * n_in]) {
                    *w += b * a;
                }
            }
        }
    }
}

/// `weight += scaling · B·A` in place; `weight` is `[out, in]` (`[in, out]` with the pair's
/// `fan_in_fan_out`). `out` and `in_` must be the pair's; the shape never changes.
pub fn merge_into(
    weight: &mut [f32],
    out: usize,
    in_: usize,
    pair: &LoraPair,
    scaling: f32,
) -> Result<(), ModelError> {
    if !pair.is_consistent() {
        return Err(ModelError::InvalidConfig(format!(
            "LoRA merge: A has {} values and B {}, not [r {r}, in {i}] and [out {o}, r {r}]",
            pair.a.len(),
            pair.b.len(),
            r = pair.r,
            i = pair.in_features,
            o = pair.out_features,
        )));
    }
    if out != pair.out_features
        || in_ != pair.in_features
        || out.checked_mul(in_) != Some(weight.len())
    {
        return Err(ModelError::InvalidConfig(format!(
            "LoRA merge: base weight of {} elements as [out {out}, in {in_}] does not fit the adapter's [out {}, in {}]",
            weight.len(),
            pair.out_features,
            pair.in_features
        )));
    }
    add_scaled_product(weight, pair, scaling);
    Ok(())
}

/// An opened PEFT LoRA adapter.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    dir: PathBuf,
    config: LoraConfig,
    pairs: BTreeMap<String, LoraPair>,
}

/// One of a pair as read: tensor name, shape, values.
type Half = (String, Vec<usize>, Vec<f32>);

/// `(module path, "A" | "B")` for a PEFT tensor name, or `None` for a non-LoRA tensor.
fn split_name(name: &str) -> Option<(String, &'static str)> {
    let name = name.strip_prefix("base_model.model.").unwrap_or(name);
    let name = name.strip_suffix(".weight")?;
    for (marker, which) in [(".lora_A", "A"), (".lora_B", "B")] {
        if let Some(pos) = name.rfind(marker) {
            let rest = &name[pos + marker.len()..];
            // Nothing after the marker, or one adapter name (`.default`).
            if rest.is_empty() || (rest.starts_with('.') && !rest[1..].contains('.')) {
                return Some((name[..pos].to_string(), which));
            }
        }
    }
    None
}

impl LoraAdapter {
    /// Reads `dir/adapter_config.json` and `dir/adapter_model.safetensors`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let config_path = dir.join("adapter_config.json");
        if !config_path.is_file() {
            return Err(ModelError::Format {
                path: dir.to_path_buf(),
                message: "not a PEFT adapter folder: adapter_config.json is missing".into(),
            });
        }
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let config = LoraConfig::from_json(&config_path, &text)?;
        let model_path = dir.join("adapter_model.safetensors");
        if !model_path.is_file() {
            let hint = if dir.join("adapter_model.bin").is_file() {
                " (adapter_model.bin, a pickle, is not read: convert it to safetensors)"
            } else {
                ""
            };
            return Err(ModelError::Format {
                path: dir.to_path_buf(),
                message: format!("adapter_model.safetensors is missing{hint}"),
            });
        }
        let file = SafetensorsFile::open(&model_path)?;
        Self::from_parts(dir, config, &file)
    }

    /// Builds the adapter from a parsed config and an opened tensor file.
    pub fn from_parts(
        dir: &Path,
        config: LoraConfig,
        file: &SafetensorsFile,
    ) -> Result<Self, ModelError> {
        let path = file.path().to_path_buf();
        let terr = |tensor: &str, message: String| ModelError::Tensor {
            path: path.clone(),
            tensor: tensor.to_string(),
            message,
        };
        let mut halves: BTreeMap<String, [Option<Half>; 2]> = BTreeMap::new();
        for t in file.tensors() {
            let Some((module, which)) = split_name(&t.name) else {
                return Err(terr(
                    &t.name,
                    "not a LoRA A/B weight (embedding LoRA, DoRA magnitudes and saved modules are not supported)".into(),
                ));
            };
            if t.shape.len() != 2 {
                return Err(terr(
                    &t.name,
                    format!("expected a matrix, found shape {:?}", t.shape),
                ));
            }
            let values = t.to_f32()?;
            let slot = &mut halves.entry(module).or_default()[usize::from(which == "B")];
            if slot.is_some() {
                return Err(terr(
                    &t.name,
                    format!("second lora_{which} for this module"),
                ));
            }
            *slot = Some((t.name.clone(), t.shape.clone(), values));
        }
        let mut pairs = BTreeMap::new();
        for (module, [a, b]) in halves {
            let (a, b) = match (a, b) {
                (Some(a), Some(b)) => (a, b),
                (Some((name, ..)), None) => {
                    return Err(terr(
                        &name,
                        format!("module {module} has lora_A but no lora_B"),
                    ))
                }
                (None, Some((name, ..))) => {
                    return Err(terr(
                        &name,
                        format!("module {module} has lora_B but no lora_A"),
                    ))
                }
                (None, None) => continue,
            };
            let (a_name, a_shape, a_values) = a;
            let (b_name, b_shape, b_values) = b;
            // Before the ranks: a fused-experts pair's rank is r · n_experts.
            if let Some(message) = config.untargeted(&module) {
                return Err(terr(&a_name, message));
            }
            let want = config.rank_for(&module).map_err(|m| terr(&a_name, m))?;
            let (r, in_features) = (a_shape[0], a_shape[1]);
            let (out_features, rb) = (b_shape[0], b_shape[1]);
            if r != rb || r != want {
                return Err(terr(
                    &a_name,
                    format!(
                        "rank mismatch for module {module}: lora_A {a_shape:?} has rank {r}, lora_B {b_name:?} {b_shape:?} has rank {rb}, adapter_config.json says {want}"
                    ),
                ));
            }
            let scaling = config.scaling_for(&module).map_err(|m| terr(&a_name, m))?;
            pairs.insert(
                module,
                LoraPair {
                    r,
                    in_features,
                    out_features,
                    a: a_values,
                    b: b_values,
                    scaling,
                    fan_in_fan_out: config.fan_in_fan_out,
                },
            );
        }
        if let Err(message) = config.check_pattern_keys() {
            return Err(ModelError::Format { path, message });
        }
        if pairs.is_empty() {
            return Err(ModelError::Format {
                path,
                message: "the adapter has no LoRA weights".into(),
            });
        }
        Ok(LoraAdapter {
            dir: dir.to_path_buf(),
            config,
            pairs,
        })
    }

    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The adapted modules by HF module path (`model.layers.0.self_attn.q_proj`), sorted.
    pub fn modules(&self) -> impl Iterator<Item = (&str, &LoraPair)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, module: &str) -> Option<&LoraPair> {
        self.pairs.get(module)
    }

    /// `scaling · B·A` for `module` in its base weight's layout; `None` if not adapted.
    pub fn delta(&self, module: &str) -> Option<Vec<f32>> {
        self.pairs.get(module).map(LoraPair::delta)
    }

    /// Merges `module`'s pair into `weight` (`[out, in]`) with the adapter's scaling.
    pub fn merge_module(
        &self,
        module: &str,
        weight: &mut [f32],
        out: usize,
        in_: usize,
    ) -> Result<(), ModelError> {
        let pair = self.pairs.get(module).ok_or_else(|| {
            ModelError::MissingTensor(format!("{module} (not adapted by {})", self.dir.display()))
        })?;
        merge_into(weight, out, in_, pair, pair.scaling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise_to_module_paths() {
        let n = |s| split_name(s);
        assert_eq!(
            n("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
            Some(("model.layers.0.self_attn.q_proj".into(), "A"))
        );
        assert_eq!(
            n("base_model.model.model.layers.1.mlp.down_proj.lora_B.default.weight"),
            Some(("model.layers.1.mlp.down_proj".into(), "B"))
        );
        assert_eq!(n("base_model.model.lm_head.weight"), None);
        assert_eq!(n("x.lora_embedding_A.default"), None);
    }

    #[test]
    fn patterns_and_rslora() {
        let cfg = LoraConfig::from_json(
            Path::new("c.json"),
            r#"{"r": 4, "lora_alpha": 8, "rank_pattern": {"v_proj": 2}, "alpha_pattern": {"layers.1.mlp.down_proj": 4}, "extra": 1}"#,
        )
        .unwrap();
        assert_eq!(cfg.rank_for("model.layers.0.self_attn.v_proj"), Ok(2));
        assert_eq!(cfg.scaling_for("model.layers.0.self_attn.v_proj"), Ok(4.0));
        assert_eq!(cfg.scaling_for("model.layers.1.mlp.down_proj"), Ok(1.0));
        assert_eq!(cfg.scaling_for("model.layers.0.mlp.down_proj"), Ok(2.0));
        let rs = LoraConfig::from_json(
            Path::new("c.json"),
            r#"{"r": 16, "lora_alpha": 8, "use_rslora": true, "target_modules": "all-linear"}"#,
        )
        .unwrap();
        assert_eq!(rs.scaling_for("q_proj"), Ok(2.0));
        assert!(rs.targets("anything"));
    }

    #[test]
    fn target_parameters_name_a_module_by_its_weight_only() {
        let cfg = LoraConfig::from_json(
            Path::new("c.json"),
            r#"{"r": 1, "lora_alpha": 2, "target_modules": ["q_proj"],
                "target_parameters": ["gate.weight", "mlp.experts.gate_up_proj", "down_proj"],
                "rank_pattern": {".*\\.gate_up_proj": 2}}"#,
        )
        .unwrap();
        assert!(cfg.targets("model.layers.0.self_attn.q_proj"));
        assert!(cfg.targets("model.layers.0.mlp.gate"));
        assert!(!cfg.targets("model.layers.0.mlp.up_gate"));
        assert!(cfg.adapts_parameters());
        assert!(cfg.check_pattern_keys().unwrap_err().contains("regex"));
        assert_eq!(cfg.untargeted("model.layers.0.mlp.gate"), None);
        for module in [
            "model.layers.0.mlp.experts",
            "model.layers.0.mlp.experts.base_layer",
        ] {
            let e = cfg.untargeted(module).unwrap();
            assert!(
                e.contains(module) && e.contains("experts of a mixture-of-experts model"),
                "{e}"
            );
        }
        let e = cfg.untargeted("model.layers.0.mlp.gate_proj").unwrap();
        assert!(
            e.contains("not supported") && e.contains("down_proj"),
            "{e}"
        );
        let plain = LoraConfig::from_json(
            Path::new("c.json"),
            r#"{"r": 1, "lora_alpha": 2, "target_modules": ["q_proj"]}"#,
        )
        .unwrap();
        let e = plain.untargeted("model.layers.0.mlp.down_proj").unwrap();
        assert!(e.contains("not in target_modules"), "{e}");
        assert!(names("a.b.q_proj", "q_proj") && names("q_proj", "q_proj"));
        assert!(!names("a.b.xq_proj", "q_proj"));
    }

    #[test]
    fn refused_options_are_named() {
        for (json, word) in [
            (r#"{"r": 4, "lora_alpha": 8, "bias": "all"}"#, "bias"),
            (r#"{"r": 4, "lora_alpha": 8, "use_dora": true}"#, "DoRA"),
            (
                r#"{"r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]}"#,
                "modules_to_save",
            ),
            (
                r#"{"r": 4, "lora_alpha": 8, "rank_pattern": {"^model.*q_proj": 8}}"#,
                "regex",
            ),
            (r#"{"r": 4, "lora_alpha": 8, "peft_type": "IA3"}"#, "IA3"),
            (r#"{"lora_alpha": 8}"#, "missing field `r`"),
        ] {
            let e = LoraConfig::from_json(Path::new("c.json"), json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(word) && e.contains("c.json"), "{json}: {e}");
        }
    }
}
