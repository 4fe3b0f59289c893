//! Hardware fit: which decoder layers of a model go to the GPU and which stay on the CPU, as
//! Ollama and llama.cpp decide it. Pure arithmetic over byte counts (no device is touched):
//! [`plan`] takes the model's sizes ([`ModelSizes`]), the GPU's memory ([`GpuMemory`]) and
//! what the user asked for ([`PlacementRequest`]), and returns a [`Placement`] with the reason
//! that the start-up line prints.
//!
//! Which layers: the **last** `k` decoder layers plus the final norm and output head go to
//! the GPU; the token embedding and the first `n - k` layers stay on the CPU. This is
//! llama.cpp's choice (`llama-model.cpp`, `load_tensors`: `i_gpu_start = max(n_layer + 1 -
//! n_gpu_layers, 0)`, the output layer counted as layer `n_layer`, so it is the first thing
//! offloaded; the input layer is always on the CPU, "there is very little benefit to
//! offloading the input layer"), which Ollama drives by passing the number of layers that fit
//! as `-ngl` (its `num_gpu`). Two reasons it is the right one here too: a step crosses
//! between the devices once, host → GPU, with the hidden state `[rows, hidden]` after the CPU
//! layers, and the logits come back from the GPU as they do for a model wholly on it; and the
//! output head (a `[vocab, hidden]` GEMM for every sampled row) is the largest single matmul
//! of a decode step, so it gains most from the GPU. The embedding is only looked up by row:
//! it costs nothing on the CPU, so it goes to the GPU only when the whole model fits there.
//!
//! What is counted on the GPU for `k` layers: their weights as the CUDA backend stores them,
//! the output norm and head, the K/V of those `k` layers for [`MIN_KV_TOKENS`] positions (the
//! engine sizes the real pool afterwards from what is left, so this is a floor that keeps one
//! sequence of a usual context room), one forward pass's workspace, and the share of the card
//! the engine leaves free (`1 - DEFAULT_GPU_SHARE` of its total, as vLLM's
//! `--gpu-memory-utilization`; the engine's KV sizing starts from the same share).
//!
//! Invariants: a [`Placement`]'s GPU layers are always a suffix `k..n` of `0..n`; the output
//! head is on the GPU exactly when at least one layer is; the embedding is on the GPU only
//! when every layer is; `--device cuda` never splits (it fails with both sizes, naming
//! `--device auto`); `auto` never fails (the CPU, with the reason, when nothing fits);
//! `--gpu-layers N` is honoured as asked (refused when `N > n_layers`).

use crate::ModelError;
use std::ops::Range;

/// Positions of K/V per GPU layer the plan keeps room for (Ollama's default context, 4096;
/// less when the model's context is shorter).
pub const MIN_KV_TOKENS: usize = 4096;

/// Share of the card's memory the engine uses by default (`--gpu-memory-utilization`); the
/// rest is left to the driver and other processes, and the plan leaves it too.
pub const DEFAULT_GPU_SHARE: f64 = 0.9;

/// A model's sizes in GPU memory, as the CUDA backend would store them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelSizes {
    /// Weight bytes of each decoder layer, `[n_layers]`.
    pub layers: Vec<u64>,
    /// The token embedding (0 when it is tied to the output head: one copy serves both).
    pub embedding: u64,
    /// The final norm and the output head.
    pub head: u64,
    /// K and V of one layer for the positions the plan keeps room for.
    pub kv_per_layer: u64,
    /// One forward pass's activation workspace (`cuda::workspace_bytes`).
    pub workspace: u64,
}

impl ModelSizes {
    /// Bytes of the whole model on the GPU (weights, floor of K/V, workspace).
    pub fn all_on_gpu(&self) -> u64 {
        self.weights() + self.kv_per_layer * self.layers.len() as u64 + self.workspace
    }

    /// Bytes of the weights alone.
    pub fn weights(&self) -> u64 {
        self.layers.iter().sum::<u64>() + self.embedding + self.head
    }

    /// Bytes on the GPU with the last `k` layers and the head there (the embedding not).
    pub fn with_last_layers(&self, k: usize) -> u64 {
        let n = self.layers.len();
        let layers: u64 = self.layers[n - k.min(n)..].iter().sum();
        layers + self.kv_per_layer * k as u64 + self.head + self.workspace
    }
}

/// The memory of the GPU the plan is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMemory {
    /// `cuda:0`.
    pub device: String,
    /// `NVIDIA H200`.
    pub name: String,
    pub free: u64,
    pub total: u64,
}

impl GpuMemory {
    /// What the plan may fill: free memory less the share the engine leaves unused.
    pub fn usable(&self) -> u64 {
        let left_alone = (self.total as f64 * (1.0 - DEFAULT_GPU_SHARE)) as u64;
        self.free.saturating_sub(left_alone)
    }
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementRequest {
    /// `--device auto`: as many layers on the GPU as fit, the rest on the CPU.
    Auto,
    /// `--device cuda[:N]`: all on the GPU, or an error (today's behaviour: weights and
    /// workspace against the free memory).
    AllOnGpu,
    /// `--gpu-layers N`: the last `N` decoder layers on the GPU, whatever the estimate says.
    Layers(usize),
}

/// Where each part of the model goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Decoder layers of the model.
    pub n_layers: usize,
    /// The layers on the GPU: `k..n_layers` (empty: the whole model on the CPU).
    pub gpu_layers: Range<usize>,
    /// Whether the token embedding is on the GPU too (only when every layer is).
    pub embedding_on_gpu: bool,
    /// One line for the start-up report: what was placed where, and why.
    pub reason: String,
}

impl Placement {
    /// The layers on the CPU: `0..k`.
    pub fn cpu_layers(&self) -> Range<usize> {
        0..self.gpu_layers.start
    }

    /// Everything on the CPU.
    pub fn all_cpu(&self) -> bool {
        self.gpu_layers.is_empty()
    }

    /// Everything (embedding included) on the GPU: the unsplit CUDA model.
    pub fn all_gpu(&self) -> bool {
        self.gpu_layers.start == 0 && self.embedding_on_gpu
    }

    /// The whole model on the CPU, for `reason`.
    pub fn cpu(n_layers: usize, reason: impl Into<String>) -> Self {
        Placement {
            n_layers,
            gpu_layers: n_layers..n_layers,
            embedding_on_gpu: false,
            reason: reason.into(),
        }
    }

    fn last(n_layers: usize, k: usize, reason: String) -> Self {
        Placement {
            n_layers,
            gpu_layers: n_layers - k..n_layers,
            embedding_on_gpu: k == n_layers,
            reason,
        }
    }
}

/// GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Decides where `sizes`' parts go on `gpu` for `request` (see the module docs).
///
/// Errors: [`PlacementRequest::AllOnGpu`] for a model whose weights and workspace exceed the
/// free memory (both sizes named, and `--device auto` as the way to split it);
/// [`PlacementRequest::Layers`] above the model's layer count.
pub fn plan(
    sizes: &ModelSizes,
    gpu: &GpuMemory,
    request: PlacementRequest,
) -> Result<Placement, ModelError> {
    let n = sizes.layers.len();
    let usable = gpu.usable();
    let label = format!("{} ({})", gpu.device, gpu.name);
    let free = format!(
        "{} ({}, {:.2} GiB free)",
        gpu.device,
        gpu.name,
        gib(gpu.free)
    );
    match request {
        PlacementRequest::AllOnGpu => {
            let need = sizes.weights() + sizes.workspace;
            if need > gpu.free {
                return Err(ModelError::Device(format!(
                    "the model needs {:.2} GiB of GPU memory for its weights (+{:.2} GiB for \
                     activations), but {label} has {:.2} GiB free of {:.2} GiB: use --device \
                     auto to run the layers that do not fit on the CPU (or --gpu-layers N), a \
                     smaller model, or --device cpu",
                    gib(sizes.weights()),
                    gib(sizes.workspace),
                    gib(gpu.free),
                    gib(gpu.total)
                )));
            }
            Ok(Placement::last(
                n,
                n,
                format!("all {n} layers on {free}: --device {}", gpu.device),
            ))
        }
        PlacementRequest::Layers(k) => {
            if k > n {
                return Err(ModelError::InvalidConfig(format!(
                    "--gpu-layers {k}: the model has {n} decoder layers (use at most {n}; 0 \
                     keeps it on the CPU)"
                )));
            }
            if k == 0 {
                return Ok(Placement::cpu(n, "cpu: --gpu-layers 0"));
            }
            let need = if k == n {
                sizes.all_on_gpu()
            } else {
                sizes.with_last_layers(k)
            };
            let warning = if need > usable {
                format!(
                    " (estimated {:.2} GiB, {:.2} GiB usable: loading or the KV cache may fail)",
                    gib(need),
                    gib(usable)
                )
            } else {
                String::new()
            };
            let reason = if k == n {
                format!("all {n} layers on {free}: --gpu-layers {k}{warning}")
            } else {
                format!(
                    "placing {k} of {n} layers on {free}; {} on the CPU: --gpu-layers {k}{warning}",
                    n - k
                )
            };
            Ok(Placement::last(n, k, reason))
        }
        PlacementRequest::Auto => {
            let whole = sizes.all_on_gpu();
            if whole <= usable {
                return Ok(Placement::last(
                    n,
                    n,
                    format!(
                        "all {n} layers on {free}: the model needs {:.2} GiB",
                        gib(whole)
                    ),
                ));
            }
            // The longest suffix of layers that fits beside the head and the workspace.
            let k = (0..=n)
                .rev()
                .find(|&k| sizes.with_last_layers(k) <= usable)
                .unwrap_or(0);
            if k == 0 {
                let one = sizes.with_last_layers(n.min(1));
                return Ok(Placement::cpu(
                    n,
                    format!(
                        "cpu: the model needs {:.2} GiB on {label} and even its output head \
                         with one layer needs {:.2} GiB, but {:.2} GiB of the {:.2} GiB free \
                         are usable ({:.2} GiB missing; --gpu-layers N forces a split)",
                        gib(whole),
                        gib(one),
                        gib(usable),
                        gib(gpu.free),
                        gib(one.saturating_sub(usable))
                    ),
                ));
            }
            let cpu = if k == n {
                "the token embedding on the CPU".to_string()
            } else {
                format!("{} on the CPU", n - k)
            };
            Ok(Placement {
                n_layers: n,
                gpu_layers: n - k..n,
                embedding_on_gpu: false,
                reason: format!(
                    "placing {k} of {n} layers on {free}; {cpu}: the model needs {:.2} GiB, \
                     {:.2} GiB usable",
                    gib(whole),
                    gib(usable)
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// 10 layers of 1 GiB, a 0.5 GiB embedding and head, 0.1 GiB of K/V per layer, 1 GiB
    /// workspace: 13 GiB in all (11 of weights).
    fn sizes() -> ModelSizes {
        ModelSizes {
            layers: vec![GIB; 10],
            embedding: GIB / 2,
            head: GIB / 2,
            kv_per_layer: GIB / 10,
            workspace: GIB,
        }
    }

    /// A card of `total` GiB with `free` GiB free.
    fn gpu(free: f64, total: u64) -> GpuMemory {
        GpuMemory {
            device: "cuda:0".into(),
            name: "Test GPU".into(),
            free: (free * GIB as f64) as u64,
            total: total * GIB,
        }
    }

    #[test]
    fn a_model_that_fits_goes_wholly_to_the_gpu() {
        let p = plan(&sizes(), &gpu(80.0, 80), PlacementRequest::Auto).expect("plan");
        assert_eq!(p.gpu_layers, 0..10);
        assert!(p.all_gpu() && !p.all_cpu());
        assert!(p.reason.contains("all 10 layers on cuda:0"), "{}", p.reason);
    }

    #[test]
    fn a_model_that_does_not_fit_puts_its_last_layers_on_the_gpu() {
        // 12 GiB free of 20 leaves 10 usable: head 0.5 + workspace 1 + 7 x 1.1 = 9.2 fits,
        // 8 x 1.1 = 10.3 does not.
        let p = plan(&sizes(), &gpu(12.0, 20), PlacementRequest::Auto).expect("plan");
        assert_eq!(p.gpu_layers, 3..10);
        assert_eq!(p.cpu_layers(), 0..3);
        assert!(!p.embedding_on_gpu && !p.all_gpu() && !p.all_cpu());
        assert!(
            p.reason.starts_with("placing 7 of 10 layers on cuda:0 (Test GPU, 12.00 GiB free); 3 on the CPU: the model needs 13.00 GiB"),
            "{}",
            p.reason
        );
        // Exactly the boundary: usable = the need of 7 layers.
        let need = sizes().with_last_layers(7);
        let probe = gpu(20.0, 20);
        let left_alone = probe.free - probe.usable();
        let exact = GpuMemory {
            free: need + left_alone,
            ..probe
        };
        let p = plan(&sizes(), &exact, PlacementRequest::Auto).expect("plan");
        assert_eq!(p.gpu_layers, 3..10);
        let short = GpuMemory {
            free: exact.free - 1,
            ..exact
        };
        assert_eq!(
            plan(&sizes(), &short, PlacementRequest::Auto)
                .expect("plan")
                .gpu_layers,
            4..10
        );
    }

    #[test]
    fn layers_of_different_sizes_are_counted_from_the_end() {
        let mut s = sizes();
        s.layers = vec![GIB, GIB, GIB, 4 * GIB, GIB];
        // 8 usable: 1.5 head+workspace, then 1.1, 4.1 (6.7), then 1.1 would make 7.8: fits;
        // another 1.1: 8.9 does not.
        let p = plan(&s, &gpu(10.0, 20), PlacementRequest::Auto).expect("plan");
        assert_eq!(p.gpu_layers, 2..5);
    }

    #[test]
    fn all_layers_but_not_the_embedding_keeps_the_embedding_on_the_cpu() {
        let mut s = sizes();
        s.embedding = 4 * GIB;
        // Layers, head, K/V, workspace: 12.5 GiB; with the embedding 16.5. 14 usable.
        let p = plan(&s, &gpu(16.0, 20), PlacementRequest::Auto).expect("plan");
        assert_eq!(p.gpu_layers, 0..10);
        assert!(!p.embedding_on_gpu && !p.all_gpu());
        assert!(
            p.reason.contains("the token embedding on the CPU"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn nothing_fits_means_the_cpu_and_says_how_much_is_missing() {
        // 2 GiB free of 10: 1 usable, and the head, workspace and one layer need 2.6.
        let p = plan(&sizes(), &gpu(2.0, 10), PlacementRequest::Auto).expect("plan");
        assert!(p.all_cpu() && !p.all_gpu());
        assert_eq!(p.gpu_layers, 10..10);
        assert_eq!(p.cpu_layers(), 0..10);
        assert!(p.reason.starts_with("cpu: "), "{}", p.reason);
        assert!(p.reason.contains("1.60 GiB missing"), "{}", p.reason);
        assert!(p.reason.contains("--gpu-layers"), "{}", p.reason);
        // A card whose free memory is below the share left alone is not an underflow.
        let p = plan(&sizes(), &gpu(0.5, 10), PlacementRequest::Auto).expect("plan");
        assert!(p.all_cpu());
    }

    #[test]
    fn device_cuda_never_splits_and_names_both_sizes_and_device_auto() {
        let e = plan(&sizes(), &gpu(11.5, 20), PlacementRequest::AllOnGpu).expect_err("too big");
        let text = e.to_string();
        for want in [
            "11.00 GiB",
            "+1.00 GiB",
            "11.50 GiB free of 20.00 GiB",
            "--device auto",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // Today's check: weights and workspace against the free memory (no K/V floor, no
        // share), so a model that loaded before still loads.
        let p = plan(&sizes(), &gpu(16.0, 20), PlacementRequest::AllOnGpu).expect("fits");
        assert!(p.all_gpu());
        assert_eq!(
            p.reason,
            "all 10 layers on cuda:0 (Test GPU, 16.00 GiB free): --device cuda:0"
        );
    }

    #[test]
    fn gpu_layers_overrides_the_plan_and_is_refused_above_the_layer_count() {
        let p = plan(&sizes(), &gpu(80.0, 80), PlacementRequest::Layers(4)).expect("plan");
        assert_eq!(p.gpu_layers, 6..10);
        assert_eq!(
            p.reason,
            "placing 4 of 10 layers on cuda:0 (Test GPU, 80.00 GiB free); 6 on the CPU: \
             --gpu-layers 4"
        );
        assert!(!p.reason.contains("may fail"), "{}", p.reason);
        let p = plan(&sizes(), &gpu(2.0, 10), PlacementRequest::Layers(4)).expect("forced");
        assert_eq!(p.gpu_layers, 6..10);
        assert!(p.reason.contains("may fail"), "{}", p.reason);
        let p = plan(&sizes(), &gpu(80.0, 80), PlacementRequest::Layers(10)).expect("all");
        assert!(p.all_gpu());
        assert!(p.reason.starts_with("all 10 layers on"), "{}", p.reason);
        let p = plan(&sizes(), &gpu(80.0, 80), PlacementRequest::Layers(0)).expect("none");
        assert!(p.all_cpu());
        let e = plan(&sizes(), &gpu(80.0, 80), PlacementRequest::Layers(11)).expect_err("11");
        assert!(e.to_string().contains("--gpu-layers 11"), "{e}");
        assert!(e.to_string().contains("10 decoder layers"), "{e}");
    }

    #[test]
    fn a_model_without_layers_is_not_a_panic() {
        let s = ModelSizes {
            layers: Vec::new(),
            ..sizes()
        };
        let p = plan(&s, &gpu(1.0, 80), PlacementRequest::Auto).expect("plan");
        assert!(p.all_cpu());
    }
}
