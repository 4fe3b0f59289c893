//! Prometheus metrics with vLLM's meanings under the `pagoda:` prefix, so dashboards made
//! for vLLM adapt by renaming. Request-level histograms are observed as requests run;
//! engine-level gauges and counters are read from each loaded model's `EngineStats` at
//! scrape time. Every request and engine series carries `model_name`; the GPU gauges
//! ([`crate::gpu_metrics`], read at scrape time too) carry `gpu` and `gpu_name` instead.
//!
//! Invariants: counters only go up — an engine's cumulative figures are turned into
//! increments against the last value seen for that model version (a new version starts
//! from its own zero); gauges of unloaded models are removed.

use crate::gpu_metrics::{GpuGauges, GpuProbe};
use crate::registry::ServedModel;
use pagoda_engine::{EngineStats, FinishReason, RequestTimings};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0,
];

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    ttft: HistogramVec,
    itl: HistogramVec,
    e2e: HistogramVec,
    queue: HistogramVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    kv_usage: GaugeVec,
    state_usage: GaugeVec,
    lora_info: GaugeVec,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
    preemptions: IntCounterVec,
    prefix_queries: IntCounterVec,
    prefix_hits: IntCounterVec,
    spec_drafts: IntCounterVec,
    spec_draft_tokens: IntCounterVec,
    spec_accepted_tokens: IntCounterVec,
    spec_acceptance_rate: GaugeVec,
    spec_mean_length: GaugeVec,
    success: IntCounterVec,
    errors: IntCounterVec,
    /// The GPU gauges, when a probe was given (none without NVML).
    gpus: Option<GpuGauges>,
    /// Last cumulative engine figures seen, per (model, version).
    seen: Mutex<HashMap<(String, String), EngineStats>>,
}

/// Why building the metrics failed (a duplicate or invalid name: a programming error).
#[derive(Debug, thiserror::Error)]
#[error("metrics setup: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// The metrics without GPU gauges.
    pub fn new() -> Result<Arc<Self>, MetricsError> {
        Self::with_gpu(None)
    }

    /// The metrics, with GPU gauges read from `gpu` at each scrape when given.
    pub fn with_gpu(gpu: Option<Box<dyn GpuProbe>>) -> Result<Arc<Self>, MetricsError> {
        let registry = Registry::new();
        let hist =
            |name: &str, help: &str, buckets: &[f64]| -> Result<HistogramVec, MetricsError> {
                let h = HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                    &["model_name"],
                )?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, MetricsError> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let igauge = |name: &str, help: &str| -> Result<IntGaugeVec, MetricsError> {
            let g = IntGaugeVec::new(Opts::new(name, help), &["model_name"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let fgauge = |name: &str, help: &str| -> Result<GaugeVec, MetricsError> {
            let g = GaugeVec::new(Opts::new(name, help), &["model_name"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let kv_usage = fgauge(
            "pagoda:kv_cache_usage_perc",
            "KV cache usage: share of KV blocks in use (1 = 100%)",
        )?;
        let state_usage = fgauge(
            "pagoda:state_slots_usage_perc",
            "Hybrid models: share of recurrent-state slots in use (1 = 100%; 0 for transformers)",
        )?;
        // The Gateway API Inference Extension's LoRA metric (vLLM's `lora_requests_info`):
        // one series whose labels list the adapters and whose value is when it was last
        // updated, so an endpoint picker can route an adapter's requests to replicas that hold
        // it. Every loaded adapter serves in any batch here, so all are running and none wait.
        let lora_info = GaugeVec::new(
            Opts::new(
                "pagoda:lora_requests_info",
                "LoRA adapters: running_lora_adapters (loaded, servable in any batch), waiting_lora_adapters (none: adapters never wait for a slot), max_lora (adapters loaded); value: unix time of this reading",
            ),
            &["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
        )?;
        registry.register(Box::new(lora_info.clone()))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let gpus = gpu
            .map(|probe| GpuGauges::register(&registry, probe))
            .transpose()?;
        let m = Metrics {
            gpus,
            ttft: hist(
                "pagoda:time_to_first_token_seconds",
                "Time from arrival to the first generated token",
                LATENCY_BUCKETS,
            )?,
            itl: hist(
                "pagoda:inter_token_latency_seconds",
                "Time between consecutive generated tokens of one sequence",
                TOKEN_BUCKETS,
            )?,
            e2e: hist(
                "pagoda:e2e_request_latency_seconds",
                "Time from arrival to the last token",
                LATENCY_BUCKETS,
            )?,
            queue: hist(
                "pagoda:request_queue_time_seconds",
                "Time a request waited before its first scheduled step",
                LATENCY_BUCKETS,
            )?,
            running: igauge(
                "pagoda:num_requests_running",
                "Sequences in the running batch",
            )?,
            waiting: igauge(
                "pagoda:num_requests_waiting",
                "Sequences waiting to be scheduled",
            )?,
            kv_usage,
            state_usage,
            lora_info,
            prompt_tokens: counter(
                "pagoda:prompt_tokens_total",
                "Prompt tokens processed (prefilled or found cached)",
                &["model_name"],
            )?,
            generation_tokens: counter(
                "pagoda:generation_tokens_total",
                "Tokens generated",
                &["model_name"],
            )?,
            preemptions: counter(
                "pagoda:num_preemptions_total",
                "Sequences preempted (KV blocks freed, recomputed later)",
                &["model_name"],
            )?,
            prefix_queries: counter(
                "pagoda:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache",
                &["model_name"],
            )?,
            prefix_hits: counter(
                "pagoda:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache",
                &["model_name"],
            )?,
            spec_drafts: counter(
                "pagoda:spec_decode_num_drafts_total",
                "Speculative decoding: decode steps that verified proposals",
                &["model_name"],
            )?,
            spec_draft_tokens: counter(
                "pagoda:spec_decode_num_draft_tokens_total",
                "Speculative decoding: tokens proposed",
                &["model_name"],
            )?,
            spec_accepted_tokens: counter(
                "pagoda:spec_decode_num_accepted_tokens_total",
                "Speculative decoding: proposed tokens accepted",
                &["model_name"],
            )?,
            spec_acceptance_rate: fgauge(
                "pagoda:spec_decode_acceptance_rate",
                "Speculative decoding: accepted / proposed tokens since start",
            )?,
            spec_mean_length: fgauge(
                "pagoda:spec_decode_mean_acceptance_length",
                "Speculative decoding: tokens emitted per verification step since start (accepted + 1)",
            )?,
            success: counter(
                "pagoda:request_success_total",
                "Finished requests by finish reason",
                &["model_name", "finished_reason"],
            )?,
            errors: counter(
                "pagoda:request_errors_total",
                "Error responses by HTTP status",
                &["status"],
            )?,
            registry,
            seen: Mutex::new(HashMap::new()),
        };
        Ok(Arc::new(m))
    }

    /// An observer for one request on `model`.
    pub fn observe(self: &Arc<Self>, model: &str) -> RequestObserver {
        RequestObserver {
            metrics: self.clone(),
            model: model.to_string(),
            last_token: HashMap::new(),
        }
    }

    /// Counts an error response.
    pub fn count_error(&self, status: u16) {
        self.errors.with_label_values(&[&status.to_string()]).inc();
    }

    /// The text exposition, after folding in the engines' current figures.
    /// The text exposition, after reading every engine's figures from `loaded` and the LoRA
    /// adapters' names from `adapters`.
    pub fn render(&self, loaded: &[Arc<ServedModel>], adapters: &[String]) -> String {
        self.refresh_engines(loaded);
        self.lora_info.reset();
        self.lora_info
            .with_label_values(&[&adapters.join(","), "", &adapters.len().to_string()])
            .set(crate::clock::unix_now() as f64);
        if let Some(g) = &self.gpus {
            g.refresh();
        }
        let mut out = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn refresh_engines(&self, loaded: &[Arc<ServedModel>]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        // Sum the versions of one name (an old version may still be finishing requests).
        let mut names: HashMap<&str, (i64, i64, usize, usize)> = HashMap::new();
        let mut states: HashMap<&str, (usize, usize)> = HashMap::new();
        for m in loaded {
            let s = m.engine.stats();
            let e = names.entry(m.name.as_str()).or_default();
            e.0 += s.running as i64;
            e.1 += s.waiting as i64;
            e.2 += s.kv_blocks_used;
            e.3 += s.kv_blocks_total;
            let st = states.entry(m.name.as_str()).or_default();
            st.0 += s.state_slots_used;
            st.1 += s.state_slots_total;
            let key = (m.name.clone(), m.version.clone());
            let before = seen.get(&key).copied().unwrap_or_default();
            let label = [m.name.as_str()];
            let inc = |c: &IntCounterVec, now: u64, was: u64| {
                c.with_label_values(&label).inc_by(now.saturating_sub(was));
            };
            inc(
                &self.prompt_tokens,
                s.prompt_tokens_total,
                before.prompt_tokens_total,
            );
            inc(
                &self.generation_tokens,
                s.generation_tokens_total,
                before.generation_tokens_total,
            );
            inc(&self.preemptions, s.preempted_total, before.preempted_total);
            inc(
                &self.prefix_queries,
                s.prefix_cache_queried_tokens,
                before.prefix_cache_queried_tokens,
            );
            inc(
                &self.prefix_hits,
                s.prefix_cache_hit_tokens,
                before.prefix_cache_hit_tokens,
            );
            inc(&self.spec_drafts, s.spec.drafts, before.spec.drafts);
            inc(
                &self.spec_draft_tokens,
                s.spec.proposed_tokens,
                before.spec.proposed_tokens,
            );
            inc(
                &self.spec_accepted_tokens,
                s.spec.accepted_tokens,
                before.spec.accepted_tokens,
            );
            if s.spec.drafts > 0 {
                self.spec_acceptance_rate
                    .with_label_values(&label)
                    .set(s.spec.acceptance_rate());
                self.spec_mean_length
                    .with_label_values(&label)
                    .set(s.spec.mean_acceptance_length());
            }
            seen.insert(key, s);
        }
        seen.retain(|(name, version), _| {
            loaded
                .iter()
                .any(|m| &m.name == name && &m.version == version)
        });
        for g in [&self.running, &self.waiting] {
            g.reset();
        }
        self.kv_usage.reset();
        self.state_usage.reset();
        for (name, (used, total)) in states {
            if total > 0 {
                self.state_usage
                    .with_label_values(&[name])
                    .set(used as f64 / total as f64);
            }
        }
        for (name, (running, waiting, used, total)) in names {
            self.running.with_label_values(&[name]).set(running);
            self.waiting.with_label_values(&[name]).set(waiting);
            let usage = if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            };
            self.kv_usage.with_label_values(&[name]).set(usage);
        }
    }
}

/// Records one request's latencies as its events arrive.
pub struct RequestObserver {
    metrics: Arc<Metrics>,
    model: String,
    /// Time of each choice's last token.
    last_token: HashMap<usize, Instant>,
}

impl RequestObserver {
    /// A token of choice `index` was produced at `at`.
    pub fn token(&mut self, index: usize, at: Instant) {
        if let Some(prev) = self.last_token.insert(index, at) {
            self.metrics
                .itl
                .with_label_values(&[&self.model])
                .observe(secs(at.saturating_duration_since(prev)));
        }
    }

    /// The client went away before the request finished (vLLM counts this as an abort).
    pub fn client_disconnected(&mut self) {
        self.metrics
            .success
            .with_label_values(&[self.model.as_str(), "abort"])
            .inc();
    }

    /// Choice `index` finished.
    pub fn finished(&mut self, index: usize, reason: FinishReason, timings: &RequestTimings) {
        let label = [self.model.as_str()];
        if index == 0 {
            if let Some(t) = timings.ttft() {
                self.metrics.ttft.with_label_values(&label).observe(secs(t));
            }
            self.metrics
                .queue
                .with_label_values(&label)
                .observe(secs(timings.queued()));
            self.metrics
                .e2e
                .with_label_values(&label)
                .observe(secs(timings.e2e()));
        }
        let reason = match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        };
        self.metrics
            .success
            .with_label_values(&[self.model.as_str(), reason])
            .inc();
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
