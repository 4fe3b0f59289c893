//! The surgery of structured pruning: a [`Keep`] (which decoder layers, and in each which
//! query heads, KV heads and MLP neurons, and which residual channels survive) applied to a
//! model's weights, giving a smaller model's weights and config ([`reshape`]).
//!
//! Every tensor is cut along the axes its role gives it ([`axes_of`]): Q rows by query head,
//! K/V rows by KV head, the attention output's columns by query head, gate/up rows and down
//! columns by neuron, and every residual-width axis (embedding and head columns, norms, the
//! matrices' hidden side) by the kept channels. A tensor whose role is not known is an error
//! naming it: a model with parts this module does not understand is refused, never written
//! half-cut.
//!
//! Invariants:
//! - Kept indices are in ascending source order, so a kept query head stays in the KV group
//!   it was in, and the new layer `i` is the `i`-th kept source layer renamed `blk.i`.
//! - Heads are whole row blocks of `head_dim` rows (true of llama.cpp's interleaved RoPE
//!   order too: the permutation stays inside a head), so head cuts are layout-independent.
//! - A tensor not cut keeps its bytes and type (a layer-dropped model keeps its
//!   quantization); a tensor cut only along rows keeps its block type (rows are
//!   independent); a tensor cut along columns is dequantized and stored F32 if it was F32 or
//!   is a vector, else F16.
//! - The returned config is what loading the written file gives back: layer count and widths
//!   from the kept sets, each kept layer's sliding-window flag, Gemma's embedding scale from
//!   the new width.

use pagoda_kernels::GgmlType;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::ModelConfig;

use super::f16_view;
use crate::CompressError;

/// What one layer of the pruned model keeps of its source layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerKeep {
    /// The source layer's index.
    pub source: usize,
    /// Kept query heads, ascending; their count divided by `kv_heads.len()` per KV group.
    pub q_heads: Vec<usize>,
    /// Kept KV heads, ascending.
    pub kv_heads: Vec<usize>,
    /// Kept MLP neurons, ascending.
    pub ffn: Vec<usize>,
}

/// What the pruned model keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keep {
    /// Kept residual channels, ascending.
    pub hidden: Vec<usize>,
    /// The new layers in order.
    pub layers: Vec<LayerKeep>,
}

impl Keep {
    /// Everything of `cfg` (the identity).
    pub fn all(cfg: &ModelConfig) -> Keep {
        Keep {
            hidden: (0..cfg.hidden_size).collect(),
            layers: (0..cfg.n_layers)
                .map(|l| LayerKeep {
                    source: l,
                    q_heads: (0..cfg.n_heads).collect(),
                    kv_heads: (0..cfg.n_kv_heads).collect(),
                    ffn: (0..cfg.ffn_dim).collect(),
                })
                .collect(),
        }
    }

    /// The config of the model this keeps of `cfg`, or why it is not a valid model: no
    /// layer, an empty width, indices out of range or not ascending, widths that differ
    /// between layers, or query heads that do not split evenly over the KV groups, each
    /// group keeping only its own heads.
    pub fn config(&self, cfg: &ModelConfig) -> Result<ModelConfig, CompressError> {
        let bad = |m: String| Err(CompressError::InvalidInput(m));
        if let Some(why) = cfg.irregular_layers() {
            return bad(format!(
                "structured pruning of a {} model is not supported yet: {why}",
                cfg.arch.family().display
            ));
        }
        let Some(first) = self.layers.first() else {
            return bad("structured pruning would leave no decoder layer".into());
        };
        check_indices("residual channels", &self.hidden, cfg.hidden_size)?;
        check_indices(
            "layers",
            &self.layers.iter().map(|l| l.source).collect::<Vec<_>>(),
            cfg.n_layers,
        )?;
        let group = cfg.n_heads / cfg.n_kv_heads;
        for l in &self.layers {
            check_indices("query heads", &l.q_heads, cfg.n_heads)?;
            check_indices("KV heads", &l.kv_heads, cfg.n_kv_heads)?;
            check_indices("MLP neurons", &l.ffn, cfg.ffn_dim)?;
            if (l.q_heads.len(), l.kv_heads.len(), l.ffn.len())
                != (first.q_heads.len(), first.kv_heads.len(), first.ffn.len())
            {
                return bad(format!(
                    "layer {} keeps other widths than layer {}: every layer must keep the same \
                     number of heads and neurons",
                    l.source, first.source
                ));
            }
            if l.q_heads.len() % l.kv_heads.len() != 0 {
                return bad(format!(
                    "{} query heads do not split evenly over {} KV heads",
                    l.q_heads.len(),
                    l.kv_heads.len()
                ));
            }
            let per_group = l.q_heads.len() / l.kv_heads.len();
            for (g, kv) in l.kv_heads.iter().enumerate() {
                let heads = &l.q_heads[g * per_group..(g + 1) * per_group];
                if let Some(h) = heads.iter().find(|&&h| h / group != *kv) {
                    return bad(format!(
                        "layer {}: query head {h} would move from KV group {} to KV group {kv}",
                        l.source,
                        h / group
                    ));
                }
            }
        }
        let mut out = cfg.clone();
        out.n_layers = self.layers.len();
        out.hidden_size = self.hidden.len();
        out.n_heads = first.q_heads.len();
        out.n_kv_heads = first.kv_heads.len();
        out.ffn_dim = first.ffn.len();
        out.layer_is_sliding = self
            .layers
            .iter()
            .map(|l| cfg.layer_is_sliding[l.source])
            .collect();
        out.layer_uses_rope = self
            .layers
            .iter()
            .map(|l| cfg.layer_uses_rope[l.source])
            .collect();
        if out.embedding_scale.is_some() {
            out.embedding_scale = Some((out.hidden_size as f32).sqrt());
        }
        out.validate()?;
        Ok(out)
    }
}

/// `idx` is ascending, without repeats, below `n` and not empty.
fn check_indices(what: &str, idx: &[usize], n: usize) -> Result<(), CompressError> {
    if idx.is_empty() {
        return Err(CompressError::InvalidInput(format!(
            "structured pruning would keep no {what}"
        )));
    }
    if idx.windows(2).any(|w| w[0] >= w[1]) || idx.iter().any(|&i| i >= n) {
        return Err(CompressError::InvalidInput(format!(
            "kept {what} must be ascending indices below {n}"
        )));
    }
    Ok(())
}

/// Which kept set an axis of a tensor is cut by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Not cut.
    Whole,
    Hidden,
    /// Query heads: blocks of `head_dim`.
    QHeads,
    /// KV heads: blocks of `head_dim`.
    KvHeads,
    Ffn,
}

/// The (row, column) axes of a tensor by its canonical name (vectors: the row axis only),
/// or `None` for a tensor structured pruning does not know.
pub fn axes_of(name: &str) -> Option<(Axis, Axis)> {
    use Axis::*;
    let (stem, _) = name.rsplit_once('.')?;
    let role = match stem.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.')?.1,
        None => stem,
    };
    Some(match role {
        "token_embd" | "output" => (Whole, Hidden),
        "output_norm" | "attn_norm" | "ffn_norm" | "post_attention_norm" | "post_ffw_norm" => {
            (Hidden, Whole)
        }
        "rope_freqs" | "attn_q_norm" | "attn_k_norm" => (Whole, Whole),
        "attn_q" => (QHeads, Hidden),
        "attn_k" | "attn_v" => (KvHeads, Hidden),
        "attn_output" => (Hidden, QHeads),
        "ffn_gate" | "ffn_up" => (Ffn, Hidden),
        "ffn_down" => (Hidden, Ffn),
        _ => return None,
    })
}

/// The source indices along `axis` for `layer` (`None`: every index, not cut).
fn indices(
    axis: Axis,
    keep: &Keep,
    layer: Option<&LayerKeep>,
    cfg: &ModelConfig,
    len: usize,
    name: &str,
) -> Result<Option<Vec<usize>>, CompressError> {
    let heads = |h: &[usize]| -> Vec<usize> {
        h.iter()
            .flat_map(|&h| h * cfg.head_dim..(h + 1) * cfg.head_dim)
            .collect()
    };
    let (full, kept) = match (axis, layer) {
        (Axis::Whole, _) => return Ok(None),
        (Axis::Hidden, _) => (cfg.hidden_size, keep.hidden.clone()),
        (Axis::QHeads, Some(l)) => (cfg.n_heads * cfg.head_dim, heads(&l.q_heads)),
        (Axis::KvHeads, Some(l)) => (cfg.n_kv_heads * cfg.head_dim, heads(&l.kv_heads)),
        (Axis::Ffn, Some(l)) => (cfg.ffn_dim, l.ffn.clone()),
        (_, None) => {
            return Err(CompressError::InvalidInput(format!(
                "{name} is outside every layer but has a per-layer axis"
            )))
        }
    };
    if len != full {
        return Err(CompressError::InvalidInput(format!(
            "{name} has {len} entries along an axis the config says is {full} wide; the model \
             file and its metadata disagree"
        )));
    }
    Ok((kept.len() != full).then_some(kept))
}

/// `view` cut to `rows` × `cols` (either `None`: not cut) and named `name`.
fn cut(
    view: &TensorView,
    name: &str,
    rows: Option<&[usize]>,
    cols: Option<&[usize]>,
) -> Result<TensorView, CompressError> {
    let rename = |v: &TensorView| {
        let mut v = v.clone();
        v.name = name.to_string();
        v
    };
    let tensor_err = |to: GgmlType, message: String| CompressError::Tensor {
        tensor: name.to_string(),
        ty: view.ty,
        shape: view.shape.clone(),
        to,
        message,
    };
    let (n_rows, n_cols) = match view.shape.as_slice() {
        [n] => (*n, 1),
        [r, c] => (*r, *c),
        other => {
            return Err(CompressError::InvalidInput(format!(
                "{} has shape {other:?}; structured pruning expects vectors and matrices",
                view.name
            )))
        }
    };
    match (rows, cols) {
        (None, None) => Ok(rename(view)),
        (Some(rows), None) if view.shape.len() == 2 => {
            // Whole rows keep their blocks.
            let row_bytes = view.n_bytes() / n_rows.max(1);
            let data = view.data();
            let mut bytes = Vec::with_capacity(rows.len() * row_bytes);
            for &r in rows {
                bytes.extend_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
            }
            TensorView::owned(name.to_string(), view.ty, vec![rows.len(), n_cols], bytes)
                .map_err(|m| tensor_err(view.ty, m))
        }
        _ => {
            let values = view.to_f32()?;
            let all_rows: Vec<usize>;
            let rows = match rows {
                Some(r) => r,
                None => {
                    all_rows = (0..n_rows).collect();
                    &all_rows
                }
            };
            let mut out = Vec::with_capacity(rows.len() * cols.map_or(n_cols, <[usize]>::len));
            for &r in rows {
                let row = &values[r * n_cols..(r + 1) * n_cols];
                match cols {
                    Some(cols) => out.extend(cols.iter().map(|&c| row[c])),
                    None => out.extend_from_slice(row),
                }
            }
            let shape = match view.shape.len() {
                1 => vec![out.len()],
                _ => vec![rows.len(), out.len() / rows.len().max(1)],
            };
            if view.shape.len() == 1 || view.ty == GgmlType::F32 {
                let bytes = out.iter().flat_map(|x| x.to_le_bytes()).collect();
                TensorView::owned(name.to_string(), GgmlType::F32, shape, bytes)
                    .map_err(|m| tensor_err(GgmlType::F32, m))
            } else {
                f16_view(name, &shape, &out)
            }
        }
    }
}

/// The layer a tensor name belongs to and the rest of its name (`blk.3.attn_q.weight` →
/// `(3, "attn_q.weight")`).
fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    Some((layer.parse().ok()?, tail))
}

/// `weights` (a model shaped by `cfg`) cut to what `keep` keeps: the smaller model's
/// weights (dropped layers' tensors left out, kept layers renumbered) and its config.
pub fn reshape(
    weights: &Weights,
    cfg: &ModelConfig,
    keep: &Keep,
) -> Result<(Weights, ModelConfig), CompressError> {
    let new_cfg = keep.config(cfg)?;
    // Source layer -> (new index, what it keeps).
    let mut by_source = vec![None; cfg.n_layers];
    for (i, l) in keep.layers.iter().enumerate() {
        by_source[l.source] = Some((i, l));
    }
    let mut out = Weights::new();
    for view in weights.iter() {
        let (rows_axis, cols_axis) = axes_of(&view.name).ok_or_else(|| {
            CompressError::InvalidInput(format!(
                "tensor {} has a role structured pruning does not know; this model cannot be \
                 pruned structurally",
                view.name
            ))
        })?;
        let (name, layer) = match split_layer(&view.name) {
            Some((l, tail)) => match by_source.get(l).copied().flatten() {
                Some((i, lk)) => (format!("blk.{i}.{tail}"), Some(lk)),
                None if l < cfg.n_layers => continue, // a dropped layer
                None => {
                    return Err(CompressError::InvalidInput(format!(
                        "tensor {} names a layer the model does not have ({} layers)",
                        view.name, cfg.n_layers
                    )))
                }
            },
            None => (view.name.clone(), None),
        };
        let (n_rows, n_cols) = match view.shape.as_slice() {
            [n] => (*n, 1),
            [r, c] => (*r, *c),
            _ => (0, 0),
        };
        let rows = indices(rows_axis, keep, layer, cfg, n_rows, &view.name)?;
        let cols = if view.shape.len() == 2 {
            indices(cols_axis, keep, layer, cfg, n_cols, &view.name)?
        } else {
            None
        };
        let cut_view = cut(view, &name, rows.as_deref(), cols.as_deref())?;
        out.insert(cut_view).map_err(CompressError::InvalidInput)?;
    }
    Ok((out, new_cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_of_the_supported_architectures_has_axes() {
        for name in [
            "token_embd.weight",
            "output.weight",
            "output_norm.weight",
            "rope_freqs.weight",
            "blk.0.attn_norm.weight",
            "blk.0.attn_q.weight",
            "blk.0.attn_q.bias",
            "blk.11.attn_k.bias",
            "blk.2.attn_v.weight",
            "blk.2.attn_output.weight",
            "blk.2.attn_q_norm.weight",
            "blk.2.attn_k_norm.weight",
            "blk.2.post_attention_norm.weight",
            "blk.2.ffn_norm.weight",
            "blk.2.ffn_gate.weight",
            "blk.2.ffn_up.weight",
            "blk.2.ffn_down.weight",
            "blk.2.post_ffw_norm.weight",
        ] {
            assert!(axes_of(name).is_some(), "{name}");
        }
        assert_eq!(axes_of("blk.0.ssm_conv.weight"), None);
        assert_eq!(
            axes_of("blk.0.attn_q.weight"),
            Some((Axis::QHeads, Axis::Hidden))
        );
        assert_eq!(
            split_layer("blk.12.ffn_up.weight"),
            Some((12, "ffn_up.weight"))
        );
    }

    #[test]
    fn cutting_rows_keeps_blocks_and_cutting_columns_goes_to_f16() {
        let values: Vec<f32> = (0..4 * 32).map(|i| i as f32 * 0.25).collect();
        let f32_bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = TensorView::owned("m", GgmlType::F32, vec![4, 32], f32_bytes).unwrap();
        let rows = cut(&view, "r", Some(&[1, 3]), None).unwrap();
        assert_eq!((rows.ty, rows.shape.clone()), (GgmlType::F32, vec![2, 32]));
        assert_eq!(rows.to_f32().unwrap()[..32], values[32..64]);
        let both = cut(&view, "b", Some(&[2]), Some(&[0, 31])).unwrap();
        assert_eq!((both.ty, both.shape.clone()), (GgmlType::F32, vec![1, 2]));
        assert_eq!(both.to_f32().unwrap(), vec![values[64], values[95]]);
        let halves: Vec<u8> = values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let h = TensorView::owned("h", GgmlType::F16, vec![4, 32], halves).unwrap();
        let cols = cut(&h, "c", None, Some(&[1, 2, 3])).unwrap();
        assert_eq!((cols.ty, cols.shape.clone()), (GgmlType::F16, vec![4, 3]));
        assert_eq!(cols.to_f32().unwrap()[3..6], values[33..36]);
        let same = cut(&view, "s", None, None).unwrap();
        assert_eq!((same.name.as_str(), same.data()), ("s", view.data()));
    }
}
