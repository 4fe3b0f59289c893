//! GPU gauges of `/metrics`: memory used and total and utilization of each NVIDIA GPU the
//! process can see, read through NVML (`libnvidia-ml.so.1`, the library `nvidia-smi` and
//! DCGM read) when it loads at run time.
//!
//! Owns: [`GpuProbe`], the seam between the gauges and where readings come from (NVML in
//! production, [`NvmlProbe`]; fixed readings in tests), and [`GpuGauges`], the three gauges
//! `pagoda:gpu_memory_used_bytes`, `pagoda:gpu_memory_total_bytes` and
//! `pagoda:gpu_utilization_perc` (a share, 1 = 100%, as `pagoda:kv_cache_usage_perc`), each
//! labelled `gpu` (NVML's index, as `nvidia-smi` numbers the cards) and `gpu_name`.
//!
//! Readings are taken when Prometheus scrapes, not on a timer: an NVML query is a driver
//! call of microseconds, the scrape interval already bounds how often it runs, the value is
//! as fresh as the scrape, and no background task has to be owned and stopped.
//!
//! Invariants: a machine without NVML (no driver, no GPU) has no GPU series at all — never a
//! zero that reads as an idle card, never a panic or a failed start; the reason is logged
//! once. Each scrape replaces the whole set: a GPU that cannot be read this time has no
//! series until it can be read again, and a failed read is logged once until a read succeeds.

use prometheus::{GaugeVec, Opts, Registry};
use std::sync::atomic::{AtomicBool, Ordering};

/// One GPU as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// NVML's device index (the `gpu` label).
    pub index: u32,
    /// The product name, e.g. "NVIDIA H200" (the `gpu_name` label).
    pub name: String,
    /// Device memory allocated (by every process on the card), in bytes.
    pub memory_used_bytes: u64,
    /// Device memory installed, in bytes.
    pub memory_total_bytes: u64,
    /// Share of the last sample period in which a kernel ran (0..=1); `None` where the GPU
    /// does not report it (some MIG and vGPU setups).
    pub utilization: Option<f64>,
}

/// Why the GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GpuProbeError {
    /// NVML did not load or start: no driver, no GPU, or a library too old.
    #[error("NVML unavailable ({0}); GPU gauges are off")]
    Unavailable(String),
    /// NVML is up but a query failed (a GPU fell off the bus, a driver reset).
    #[error("reading {what} of GPU {index}: {message}")]
    Query {
        what: &'static str,
        index: u32,
        message: String,
    },
    /// NVML is up but the device count could not be read.
    #[error("counting GPUs: {0}")]
    Count(String),
}

/// Where GPU readings come from.
pub trait GpuProbe: Send + Sync {
    /// Every GPU's reading now. An error for one GPU fails the whole reading (the gauges
    /// then have no GPU series until a reading succeeds).
    fn read(&self) -> Result<Vec<GpuReading>, GpuProbeError>;
}

/// NVML, loaded at run time by nvml-wrapper (libloading: nothing linked at build time).
pub struct NvmlProbe {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlProbe {
    /// Loads and initialises NVML; the error says why not (library missing, driver not
    /// loaded, no GPU).
    pub fn open() -> Result<Self, GpuProbeError> {
        let nvml =
            nvml_wrapper::Nvml::init().map_err(|e| GpuProbeError::Unavailable(e.to_string()))?;
        Ok(NvmlProbe { nvml })
    }
}

impl GpuProbe for NvmlProbe {
    fn read(&self) -> Result<Vec<GpuReading>, GpuProbeError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| GpuProbeError::Count(e.to_string()))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let query = |what: &'static str| {
                move |e: nvml_wrapper::error::NvmlError| GpuProbeError::Query {
                    what,
                    index,
                    message: e.to_string(),
                }
            };
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(query("the handle"))?;
            let name = device.name().map_err(query("the name"))?;
            let memory = device.memory_info().map_err(query("memory"))?;
            let utilization = match device.utilization_rates() {
                Ok(u) => Some(f64::from(u.gpu) / 100.0),
                Err(nvml_wrapper::error::NvmlError::NotSupported) => None,
                Err(e) => return Err(query("utilization")(e)),
            };
            out.push(GpuReading {
                index,
                name,
                memory_used_bytes: memory.used,
                memory_total_bytes: memory.total,
                utilization,
            });
        }
        Ok(out)
    }
}

/// The three GPU gauges and the probe they are read from.
pub struct GpuGauges {
    probe: Box<dyn GpuProbe>,
    used: GaugeVec,
    total: GaugeVec,
    utilization: GaugeVec,
    /// Whether the last reading failed (so a failure is logged once, not every scrape).
    failing: AtomicBool,
}

const LABELS: &[&str] = &["gpu", "gpu_name"];

impl GpuGauges {
    /// Registers the gauges in `registry`; they stay empty until [`GpuGauges::refresh`].
    pub fn register(
        registry: &Registry,
        probe: Box<dyn GpuProbe>,
    ) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<GaugeVec, prometheus::Error> {
            let g = GaugeVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(GpuGauges {
            probe,
            used: gauge(
                "pagoda:gpu_memory_used_bytes",
                "GPU memory allocated on the card by every process (NVML), in bytes",
            )?,
            total: gauge(
                "pagoda:gpu_memory_total_bytes",
                "GPU memory installed on the card (NVML), in bytes",
            )?,
            utilization: gauge(
                "pagoda:gpu_utilization_perc",
                "GPU utilization: share of NVML's last sample period in which a kernel ran (1 = 100%)",
            )?,
            failing: AtomicBool::new(false),
        })
    }

    /// Replaces the gauges' series with a reading taken now (see the module's invariants).
    pub fn refresh(&self) {
        for g in [&self.used, &self.total, &self.utilization] {
            g.reset();
        }
        match self.probe.read() {
            Ok(readings) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(gpus = readings.len(), "GPU gauges read again");
                }
                for r in readings {
                    let index = r.index.to_string();
                    let labels = [index.as_str(), r.name.as_str()];
                    self.used
                        .with_label_values(&labels)
                        .set(r.memory_used_bytes as f64);
                    self.total
                        .with_label_values(&labels)
                        .set(r.memory_total_bytes as f64);
                    if let Some(u) = r.utilization {
                        self.utilization.with_label_values(&labels).set(u);
                    }
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "GPU gauges: reading failed; no GPU series until a reading succeeds");
                }
            }
        }
    }
}

/// NVML's probe when NVML loads, else `None` after one log line saying why: at debug level
/// (`-vv`), since on a machine without an NVIDIA GPU there is nothing to say (issue 41: no
/// GPU line there unless asked for).
pub fn nvml_probe() -> Option<Box<dyn GpuProbe>> {
    match NvmlProbe::open() {
        Ok(p) => {
            tracing::info!("GPU gauges on: NVML loaded");
            Some(Box::new(p))
        }
        Err(e) => {
            tracing::debug!(reason = %e, "no GPU gauges on /metrics");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Readings set by the test, or a failure.
    struct Fake(Arc<Mutex<Result<Vec<GpuReading>, String>>>);

    impl GpuProbe for Fake {
        fn read(&self) -> Result<Vec<GpuReading>, GpuProbeError> {
            self.0
                .lock()
                .expect("not poisoned")
                .clone()
                .map_err(GpuProbeError::Count)
        }
    }

    fn text(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .expect("encodes");
        String::from_utf8(out).expect("utf-8")
    }

    fn h200(index: u32, used: u64, util: Option<f64>) -> GpuReading {
        GpuReading {
            index,
            name: "NVIDIA H200".into(),
            memory_used_bytes: used,
            memory_total_bytes: 150_754_820_096,
            utilization: util,
        }
    }

    #[test]
    fn a_reading_becomes_one_series_per_gpu_and_a_failed_one_none() {
        let state = Arc::new(Mutex::new(Ok(vec![
            h200(0, 1 << 30, Some(0.87)),
            h200(1, 2 << 30, None),
        ])));
        let registry = Registry::new();
        let gauges = GpuGauges::register(&registry, Box::new(Fake(state.clone()))).expect("ok");
        // Nothing before the first scrape.
        assert!(!text(&registry).contains("pagoda:gpu_"));
        gauges.refresh();
        let t = text(&registry);
        for line in [
            r#"pagoda:gpu_memory_used_bytes{gpu="0",gpu_name="NVIDIA H200"} 1073741824"#,
            r#"pagoda:gpu_memory_used_bytes{gpu="1",gpu_name="NVIDIA H200"} 2147483648"#,
            r#"pagoda:gpu_memory_total_bytes{gpu="0",gpu_name="NVIDIA H200"} 150754820096"#,
            r#"pagoda:gpu_memory_total_bytes{gpu="1",gpu_name="NVIDIA H200"} 150754820096"#,
            r#"pagoda:gpu_utilization_perc{gpu="0",gpu_name="NVIDIA H200"} 0.87"#,
        ] {
            assert!(t.lines().any(|l| l == line), "no `{line}` in\n{t}");
        }
        // GPU 1 does not report utilization: no series rather than a made-up 0.
        assert!(!t.contains(r#"pagoda:gpu_utilization_perc{gpu="1""#), "{t}");

        // A failed reading leaves no stale series behind.
        *state.lock().expect("not poisoned") = Err("GPU is lost".into());
        gauges.refresh();
        let t = text(&registry);
        assert!(!t.contains("pagoda:gpu_"), "{t}");

        // And the next good reading brings them back, with new values.
        *state.lock().expect("not poisoned") = Ok(vec![h200(0, 5, Some(0.0))]);
        gauges.refresh();
        let t = text(&registry);
        assert!(
            t.lines()
                .any(|l| l == r#"pagoda:gpu_memory_used_bytes{gpu="0",gpu_name="NVIDIA H200"} 5"#),
            "{t}"
        );
        assert!(!t.contains(r#"gpu="1""#), "{t}");
    }

    #[test]
    fn the_server_metrics_export_the_gpu_gauges_beside_their_own() {
        let state = Arc::new(Mutex::new(Ok(vec![h200(0, 7 << 30, Some(0.5))])));
        let metrics =
            crate::metrics::Metrics::with_gpu(Some(Box::new(Fake(state)))).expect("metrics");
        metrics.count_error(503);
        let t = metrics.render(&[], &[]);
        for line in [
            r#"pagoda:request_errors_total{status="503"} 1"#,
            r#"pagoda:gpu_memory_used_bytes{gpu="0",gpu_name="NVIDIA H200"} 7516192768"#,
            r#"pagoda:gpu_memory_total_bytes{gpu="0",gpu_name="NVIDIA H200"} 150754820096"#,
            r#"pagoda:gpu_utilization_perc{gpu="0",gpu_name="NVIDIA H200"} 0.5"#,
        ] {
            assert!(t.lines().any(|l| l == line), "no `{line}` in\n{t}");
        }
        // Without a probe: none of them.
        let plain = crate::metrics::Metrics::new().expect("metrics");
        assert!(!plain.render(&[], &[]).contains("pagoda:gpu_"));
    }

    #[test]
    fn without_nvml_opening_is_an_error_naming_it_not_a_panic() {
        // On a machine with a GPU this opens; on one without (CI) it must fail cleanly.
        match NvmlProbe::open() {
            Ok(p) => {
                let readings = p.read().expect("NVML loaded, so it reads");
                assert!(readings.iter().all(|r| r.memory_total_bytes > 0));
            }
            Err(e) => assert!(e.to_string().contains("NVML"), "{e}"),
        }
    }
}
