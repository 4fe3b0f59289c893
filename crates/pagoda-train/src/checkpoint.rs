//! Training checkpoints: everything needed to continue a run exactly — the trainable
//! tensors, AdamW's moments and step, the optimiser step reached — and what to refuse a
//! resume on: the student's fingerprint (architecture, tensor names and shapes, source
//! digest), the teacher's, the data digest and the options that change the result.
//!
//! Layout of a checkpoint folder: `trainable.safetensors` (by trainable name),
//! `optimizer.safetensors` (`m.<name>`, `v.<name>`), `state.json` ([`CheckpointState`]).
//!
//! Invariants: a checkpoint is written to `DIR.partial` and renamed over `DIR` only when
//! complete (the previous one is moved aside first and removed after), so `DIR` is always
//! a whole checkpoint; a resume refuses a checkpoint whose fingerprint or options differ,
//! naming each difference.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::optim::AdamW;

/// What a checkpoint belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// `llama`, `qwen2`.
    pub architecture: String,
    /// Every student tensor's canonical name and shape.
    pub tensors: Vec<(String, Vec<usize>)>,
    /// [`crate::labels::fingerprint`] of the student's file or folder.
    pub student_source: String,
    /// The same of the teacher.
    pub teacher: String,
    /// Digest of the tokenized data (training and held-out sequences).
    pub data_digest: String,
}

/// `state.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Optimiser steps done.
    pub step: u64,
    /// AdamW's own step (equal to `step`; kept apart for clarity).
    pub adam_step: u64,
    /// Seed of the data order (and of LoRA's initial `A`).
    pub seed: u64,
    pub fingerprint: Fingerprint,
    /// The options that change the result, by flag name.
    pub options: BTreeMap<String, String>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> TrainError + '_ {
    move |e| TrainError::io(path, e)
}

/// `DIR.partial`.
fn partial(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Writes a checkpoint of `vars`, `opt` and `state` to `dir`, atomically.
pub fn save(
    dir: &Path,
    vars: &BTreeMap<String, Var>,
    opt: &AdamW,
    state: &CheckpointState,
) -> Result<()> {
    let tmp = partial(dir);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        let params: HashMap<String, Tensor> = vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&params, tmp.join("trainable.safetensors"))?;
        let mut moments = HashMap::new();
        for (n, t) in &opt.m {
            moments.insert(format!("m.{n}"), t.clone());
        }
        for (n, t) in &opt.v {
            moments.insert(format!("v.{n}"), t.clone());
        }
        candle_core::safetensors::save(&moments, tmp.join("optimizer.safetensors"))?;
        let json = serde_json::to_string_pretty(state)
            .map_err(|e| TrainError::Data(format!("checkpoint state: {e}")))?;
        let p = tmp.join("state.json");
        std::fs::write(&p, json).map_err(io(&p))?;
        Ok::<_, TrainError>(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let mut old = dir.as_os_str().to_owned();
    old.push(".old");
    let old = PathBuf::from(old);
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(dir, &old).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(dir))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}

fn refusal(dir: &Path, what: String) -> TrainError {
    TrainError::Stale(format!("cannot resume from {}: {what}", dir.display()))
}

/// Reads `dir`'s state and checks it against what this run is (`fingerprint`, `options`),
/// naming every difference; reads no tensor.
pub fn check(
    dir: &Path,
    fingerprint: &Fingerprint,
    options: &BTreeMap<String, String>,
) -> Result<CheckpointState> {
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TrainError::Stale(format!(
            "{} is not a distillation checkpoint (no state.json)",
            dir.display()
        )),
        _ => TrainError::io(&p, e),
    })?;
    let state: CheckpointState = serde_json::from_str(&text)
        .map_err(|e| TrainError::Stale(format!("{}: damaged ({e})", p.display())))?;
    let refuse =
        |what: String| TrainError::Stale(format!("cannot resume from {}: {what}", dir.display()));
    let f = &state.fingerprint;
    if f.architecture != fingerprint.architecture || f.tensors != fingerprint.tensors {
        let first = f
            .tensors
            .iter()
            .zip(&fingerprint.tensors)
            .find(|(a, b)| a != b)
            .map(|(a, b)| {
                format!(
                    " (first difference: {} {:?} there, {} {:?} here)",
                    a.0, a.1, b.0, b.1
                )
            })
            .unwrap_or_default();
        return Err(refuse(format!(
            "it was made for another student model: a {} with {} tensors, this student is a \
             {} with {} tensors{first}",
            f.architecture,
            f.tensors.len(),
            fingerprint.architecture,
            fingerprint.tensors.len()
        )));
    }
    if f.student_source != fingerprint.student_source {
        return Err(refuse(format!(
            "it was made from the student {}, this run's student is {}",
            f.student_source, fingerprint.student_source
        )));
    }
    if f.teacher != fingerprint.teacher {
        return Err(refuse(format!(
            "it was made with the teacher {}, this run's teacher is {}",
            f.teacher, fingerprint.teacher
        )));
    }
    if f.data_digest != fingerprint.data_digest {
        return Err(refuse(
            "it was made on other data (the tokenized data's digest differs)".into(),
        ));
    }
    let mut diffs = Vec::new();
    for key in state.options.keys().chain(options.keys()) {
        let (a, b) = (state.options.get(key), options.get(key));
        if a != b
            && !diffs
                .iter()
                .any(|d: &String| d.starts_with(&format!("{key} ")))
        {
            diffs.push(format!(
                "{key} {} there, {} here",
                a.map_or("unset", String::as_str),
                b.map_or("unset", String::as_str)
            ));
        }
    }
    if !diffs.is_empty() {
        return Err(refuse(format!("options differ: {}", diffs.join("; "))));
    }
    Ok(state)
}

/// [`check`]s `dir`, then loads its tensors into `vars` and `opt`. Returns the state.
pub fn resume(
    dir: &Path,
    fingerprint: &Fingerprint,
    options: &BTreeMap<String, String>,
    vars: &BTreeMap<String, Var>,
    opt: &mut AdamW,
) -> Result<CheckpointState> {
    let state = check(dir, fingerprint, options)?;
    let refuse = |what: String| refusal(dir, what);
    let load = |name: &str| -> Result<HashMap<String, Tensor>> {
        let p = dir.join(name);
        if !p.exists() {
            return Err(refuse(format!("{name} is missing")));
        }
        Ok(candle_core::safetensors::load(&p, &Device::Cpu)?)
    };
    let params = load("trainable.safetensors")?;
    let moments = load("optimizer.safetensors")?;
    for (name, var) in vars {
        let get = |map: &HashMap<String, Tensor>, key: &str| -> Result<Tensor> {
            let t = map
                .get(key)
                .ok_or_else(|| refuse(format!("it has no tensor {key}")))?;
            if t.dims() != var.as_tensor().dims() {
                return Err(refuse(format!(
                    "its {key} is {:?}, here {:?}",
                    t.dims(),
                    var.as_tensor().dims()
                )));
            }
            Ok(t.clone())
        };
        var.set(&get(&params, name)?)?;
        opt.m
            .insert(name.clone(), get(&moments, &format!("m.{name}"))?);
        opt.v
            .insert(name.clone(), get(&moments, &format!("v.{name}"))?);
    }
    if params.len() != vars.len() {
        return Err(refuse(format!(
            "it holds {} trainable tensors, this run trains {} (another training mode?)",
            params.len(),
            vars.len()
        )));
    }
    opt.step = state.adam_step;
    Ok(state)
}
