//! Sends a [`Workload`] to a server and records what each request measured.
//!
//! One dispatcher loop (the caller's task) owns the workload, starts each request as its
//! own tokio task, and gathers the results: under [`Arrival::Concurrency`] a new request
//! starts whenever fewer than `n` are in flight (closed loop); under [`Arrival::Poisson`]
//! requests start at exponentially distributed intervals of mean `1/rate`, drawn from the
//! seed, whatever is in flight (open loop). The warm-up requests run first, closed loop, and
//! are not measured; the first of them is retried while the server answers 503 (a server
//! still loading its models), up to the timeout. Under [`Limit::Duration`] no request starts after the duration; those
//! in flight finish (each within `timeout`) and count.
//!
//! Per request: the start, the first chunk with content (TTFT), the gap before every later
//! content chunk (inter-token latencies), the end of the stream, token counts from the final
//! usage chunk (else the content chunks are counted, and the prompt is the workload's hint),
//! and the error if any: an HTTP status with the server's message, a transport error, a
//! timeout, an `error` event in the stream, or a stream that ends before `[DONE]`.
//!
//! Invariants: times are seconds since the measured phase began, on the monotonic clock;
//! `ttft_s <= e2e_s`; the records come back in completion order; the api key is sent as a
//! bearer token and never written anywhere.

use crate::workload::{RequestSpec, Workload};
use crate::{BenchError, Sla, Summary};
use futures_util::StreamExt;
use pagoda_protocol::sse::SseReader;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// When requests start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Open loop: a Poisson process of `rate` requests per second (infinite: all at once).
    Poisson { rate: f64 },
    /// Closed loop: `n` requests in flight at all times.
    Concurrency(usize),
}

/// When the measured phase stops starting requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// After this many requests.
    Requests(usize),
    /// After this long.
    Duration(#[serde(serialize_with = "secs")] Duration),
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// How to run.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// The server, e.g. `http://127.0.0.1:11435` (a trailing `/` or `/v1` is dropped).
    pub base_url: String,
    /// Sent as `Authorization: Bearer`; never serialized.
    #[serde(skip)]
    pub api_key: Option<String>,
    pub arrival: Arrival,
    pub warmup_requests: usize,
    pub limit: Limit,
    /// Seed of the Poisson arrivals.
    pub seed: u64,
    /// Longest one request may take, connect to the end of its stream.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
}

impl RunConfig {
    /// Checks the ranges; the runner calls it first.
    pub fn validate(&self) -> Result<(), BenchError> {
        match self.arrival {
            Arrival::Poisson { rate } if rate.is_nan() || rate <= 0.0 => {
                return Err(BenchError::Config(format!(
                    "the request rate must be positive, got {rate}"
                )))
            }
            Arrival::Concurrency(0) => {
                return Err(BenchError::Config(
                    "the concurrency must be at least 1".into(),
                ))
            }
            _ => {}
        }
        match self.limit {
            Limit::Requests(0) => Err(BenchError::Config(
                "the number of requests must be at least 1".into(),
            )),
            Limit::Duration(d) if d.is_zero() => {
                Err(BenchError::Config("the duration must be positive".into()))
            }
            _ if self.timeout.is_zero() => {
                Err(BenchError::Config("the timeout must be positive".into()))
            }
            _ => Ok(()),
        }
    }

    /// The base URL without a trailing `/` or `/v1`.
    pub fn base(&self) -> &str {
        let b = self.base_url.trim_end_matches('/');
        b.strip_suffix("/v1").unwrap_or(b)
    }
}

/// What one request measured; times in seconds since the measured phase began.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub start_s: f64,
    /// Start to the first chunk with content; `None` when none came.
    pub ttft_s: Option<f64>,
    /// Gaps between consecutive content chunks.
    pub itl_s: Vec<f64>,
    pub end_s: f64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub error: Option<String>,
}

impl RequestRecord {
    /// Start to end.
    pub fn e2e_s(&self) -> f64 {
        self.end_s - self.start_s
    }

    /// `(e2e - ttft) / (completion_tokens - 1)`; `None` with fewer than two tokens.
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.completion_tokens >= 2)
            .then(|| (self.e2e_s() - ttft) / (self.completion_tokens - 1) as f64)
    }
}

/// The state of a run, for a live progress line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Still warming up (figures below are the warm-up's).
    pub warmup: bool,
    pub done: usize,
    /// Requests planned, when known (a request count).
    pub total: Option<usize>,
    pub errors: usize,
    pub in_flight: usize,
    pub output_tokens: usize,
    pub elapsed: Duration,
}

impl Progress {
    /// Finished requests per second so far.
    pub fn request_rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Output tokens per second so far.
    pub fn output_tokens_per_s(&self) -> f64 {
        self.output_tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The outcome of a run: one record per measured request, and the measured duration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub records: Vec<RequestRecord>,
    /// From the first measured start to the last end.
    pub duration_s: f64,
}

impl RunReport {
    /// The figures, with goodput under `sla`.
    pub fn summary(&self, sla: Option<&Sla>) -> Summary {
        Summary::from_records(&self.records, self.duration_s, sla)
    }
}

/// The models the server lists at `/v1/models` (also a reachability check).
pub async fn list_models(config: &RunConfig) -> Result<Vec<String>, BenchError> {
    let url = format!("{}/v1/models", config.base());
    let unreachable = |message: String| BenchError::Unreachable {
        url: url.clone(),
        message,
    };
    let client = client(config).map_err(|e| unreachable(e.to_string()))?;
    let mut req = client.get(&url).timeout(Duration::from_secs(10));
    if let Some(key) = &config.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.map_err(|e| unreachable(transport(&e)))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| unreachable(transport(&e)))?;
    if !status.is_success() {
        return Err(unreachable(format!(
            "HTTP {}: {}",
            status.as_u16(),
            short(&text)
        )));
    }
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| unreachable(format!("/v1/models is not JSON ({e}): {}", short(&text))))?;
    Ok(v["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

fn client(config: &RunConfig) -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .timeout(config.timeout)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10).min(config.timeout))
        .build()
        .map_err(|e| BenchError::Config(format!("building the HTTP client: {e}")))
}

/// Runs the warm-up, then the measured phase; calls `progress` at every finished request
/// and at least every 250 ms.
pub async fn run(
    config: &RunConfig,
    workload: &mut Workload,
    mut progress: impl FnMut(&Progress),
) -> Result<RunReport, BenchError> {
    config.validate()?;
    let client = client(config)?;
    let ctx = Ctx {
        client,
        base: config.base().to_string(),
        api_key: config.api_key.clone(),
    };
    if config.warmup_requests > 0 {
        // The first warm-up request goes alone and is retried while the server answers 503
        // (still loading its models), up to the timeout.
        let deadline = Instant::now() + config.timeout;
        let spec = workload.next_request();
        let first = loop {
            let r = one_request(ctx.clone(), spec.clone(), Instant::now()).await;
            match &r.error {
                Some(e) if e.starts_with("HTTP 503") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ => break r,
            }
        };
        let n = match config.arrival {
            Arrival::Concurrency(n) => n,
            Arrival::Poisson { .. } => 1,
        };
        let mut warm = vec![first];
        if config.warmup_requests > 1 {
            warm.extend(
                phase(
                    &ctx,
                    workload,
                    Arrival::Concurrency(n),
                    Limit::Requests(config.warmup_requests - 1),
                    config.seed,
                    true,
                    &mut progress,
                )
                .await
                .records,
            );
        }
        if let Some(first) = warm.iter().find_map(|r| r.error.clone()) {
            if warm.iter().all(|r| r.error.is_some()) {
                return Err(BenchError::WarmupFailed {
                    count: warm.len(),
                    first,
                });
            }
        }
    }
    Ok(phase(
        &ctx,
        workload,
        config.arrival,
        config.limit,
        config.seed,
        false,
        &mut progress,
    )
    .await)
}

/// What every request task needs.
#[derive(Clone)]
struct Ctx {
    client: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

/// One phase (warm-up or measured): the dispatcher loop.
async fn phase(
    ctx: &Ctx,
    workload: &mut Workload,
    arrival: Arrival,
    limit: Limit,
    seed: u64,
    warmup: bool,
    progress: &mut impl FnMut(&Progress),
) -> RunReport {
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_arrival = t0;
    let mut started = 0usize;
    let mut tasks: JoinSet<RequestRecord> = JoinSet::new();
    let mut records = Vec::new();
    let mut state = Progress {
        warmup,
        done: 0,
        total: match limit {
            Limit::Requests(n) => Some(n),
            Limit::Duration(_) => None,
        },
        errors: 0,
        in_flight: 0,
        output_tokens: 0,
        elapsed: Duration::ZERO,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let now = Instant::now();
        let more = match limit {
            Limit::Requests(n) => started < n,
            Limit::Duration(d) => now.duration_since(t0) < d,
        };
        let may_start = more
            && match arrival {
                Arrival::Concurrency(n) => tasks.len() < n,
                Arrival::Poisson { .. } => now >= next_arrival,
            };
        if may_start {
            let spec = workload.next_request();
            tasks.spawn(one_request(ctx.clone(), spec, t0));
            started += 1;
            if let Arrival::Poisson { rate } = arrival {
                next_arrival += exponential(&mut rng, rate);
            }
            continue;
        }
        if !more && tasks.is_empty() {
            break;
        }
        let poisson_wait = matches!(arrival, Arrival::Poisson { .. }) && more;
        let deadline = match limit {
            Limit::Duration(d) if more => Some(t0 + d),
            _ => None,
        };
        tokio::select! {
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                let record = joined.unwrap_or_else(|e| RequestRecord {
                    start_s: 0.0,
                    ttft_s: None,
                    itl_s: Vec::new(),
                    end_s: t0.elapsed().as_secs_f64(),
                    prompt_tokens: 0,
                    completion_tokens: 0,
                    error: Some(format!("request task failed: {e}")),
                });
                state.done += 1;
                if record.error.is_some() {
                    state.errors += 1;
                } else {
                    state.output_tokens += record.completion_tokens;
                }
                records.push(record);
            }
            _ = tokio::time::sleep_until(next_arrival), if poisson_wait => {}
            _ = tokio::time::sleep_until(deadline.unwrap_or(t0)), if deadline.is_some() => {}
            _ = tick.tick() => {}
        }
        state.in_flight = tasks.len();
        state.elapsed = t0.elapsed();
        progress(&state);
    }
    let first = records
        .iter()
        .map(|r| r.start_s)
        .fold(f64::INFINITY, f64::min);
    let last = records.iter().map(|r| r.end_s).fold(0.0, f64::max);
    RunReport {
        duration_s: if records.is_empty() {
            0.0
        } else {
            (last - first).max(0.0)
        },
        records,
    }
}

/// An exponential inter-arrival time of mean `1/rate` (zero for an infinite rate).
pub fn exponential(rng: &mut impl Rng, rate: f64) -> Duration {
    if rate.is_infinite() {
        return Duration::ZERO;
    }
    let u: f64 = rng.gen::<f64>(); // [0, 1)
    Duration::from_secs_f64(-(1.0 - u).ln() / rate)
}

/// Sends one request and times its stream.
async fn one_request(ctx: Ctx, spec: RequestSpec, t0: Instant) -> RequestRecord {
    let start = Instant::now();
    let at = |i: Instant| i.duration_since(t0).as_secs_f64();
    let mut record = RequestRecord {
        start_s: at(start),
        ttft_s: None,
        itl_s: Vec::new(),
        end_s: at(start),
        prompt_tokens: 0,
        completion_tokens: 0,
        error: None,
    };
    let outcome = stream(&ctx, &spec, start, &mut record).await;
    let end = Instant::now();
    record.end_s = at(end);
    if let Err(e) = outcome {
        record.error = Some(e);
    }
    if record.prompt_tokens == 0 {
        record.prompt_tokens = spec.prompt_tokens_hint.unwrap_or(0);
    }
    record
}

/// The request itself; fills `record`'s TTFT, gaps and tokens as chunks arrive.
async fn stream(
    ctx: &Ctx,
    spec: &RequestSpec,
    start: Instant,
    record: &mut RequestRecord,
) -> Result<(), String> {
    let url = format!("{}{}", ctx.base, spec.endpoint.path());
    let mut req = ctx.client.post(&url).json(&spec.body);
    if let Some(key) = &ctx.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.map_err(|e| transport(&e))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(String::from))
            .unwrap_or(text);
        return Err(format!("HTTP {}: {}", status.as_u16(), short(&message)));
    }
    let mut body = resp.bytes_stream();
    let mut reader = SseReader::new();
    let mut last: Option<Instant> = None;
    let mut chunks = 0usize;
    let mut usage: Option<(usize, usize)> = None;
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| transport(&e))?;
        let now = Instant::now();
        for event in reader.feed(&piece) {
            if event.is_done() {
                record.completion_tokens = usage.map_or(chunks, |u| u.1);
                record.prompt_tokens = usage.map_or(0, |u| u.0);
                return Ok(());
            }
            let v: Value = serde_json::from_str(&event.data)
                .map_err(|e| format!("stream event is not JSON ({e}): {}", short(&event.data)))?;
            if event.event.as_deref() == Some("error") || v.get("error").is_some() {
                let message = v["error"]["message"]
                    .as_str()
                    .map_or_else(|| short(&event.data), String::from);
                return Err(format!("stream error: {message}"));
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
                usage = Some((n("prompt_tokens"), n("completion_tokens")));
            }
            if has_content(&v) {
                chunks += 1;
                match last {
                    None => record.ttft_s = Some(now.duration_since(start).as_secs_f64()),
                    Some(prev) => record.itl_s.push(now.duration_since(prev).as_secs_f64()),
                }
                last = Some(now);
            }
        }
    }
    Err("the stream ended before [DONE]".into())
}

/// Whether a chunk carries generated text (chat `delta.content` or `reasoning_content`,
/// completion `text`).
fn has_content(chunk: &Value) -> bool {
    let nonempty = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    chunk["choices"].as_array().is_some_and(|choices| {
        choices.iter().any(|c| {
            nonempty(&c["delta"]["content"])
                || nonempty(&c["delta"]["reasoning_content"])
                || nonempty(&c["text"])
        })
    })
}

/// A transport error in a few words: timeout, refused connection, or reqwest's text.
fn transport(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        let mut source: Option<&dyn std::error::Error> = Some(e);
        let mut deepest = e.to_string();
        while let Some(s) = source {
            deepest = s.to_string();
            source = s.source();
        }
        format!("connection failed: {deepest}")
    } else {
        format!("transport error: {e}")
    }
}

/// `text` cut to 200 characters on one line.
fn short(text: &str) -> String {
    let one_line = text.trim().replace('\n', " ");
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_have_mean_one_over_rate() {
        let mut rng = StdRng::seed_from_u64(0);
        let n = 20_000;
        let total: f64 = (0..n)
            .map(|_| exponential(&mut rng, 4.0).as_secs_f64())
            .sum();
        let mean = total / n as f64;
        // Standard error of the mean: 0.25 / sqrt(20000) = 0.0018; allow ~3%.
        assert!((mean - 0.25).abs() < 0.0075, "mean gap {mean}");
        assert_eq!(exponential(&mut rng, f64::INFINITY), Duration::ZERO);
        // The same seed, the same arrivals.
        let a: Vec<_> = (0..5)
            .map({
                let mut r = StdRng::seed_from_u64(3);
                move |_| exponential(&mut r, 2.0)
            })
            .collect();
        let b: Vec<_> = (0..5)
            .map({
                let mut r = StdRng::seed_from_u64(3);
                move |_| exponential(&mut r, 2.0)
            })
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn config_ranges_and_base_url() {
        let ok = RunConfig {
            base_url: "http://h:1/v1/".into(),
            api_key: None,
            arrival: Arrival::Concurrency(2),
            warmup_requests: 0,
            limit: Limit::Requests(3),
            seed: 0,
            timeout: Duration::from_secs(5),
        };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.base(), "http://h:1");
        for bad in [
            RunConfig {
                arrival: Arrival::Concurrency(0),
                ..ok.clone()
            },
            RunConfig {
                arrival: Arrival::Poisson { rate: 0.0 },
                ..ok.clone()
            },
            RunConfig {
                limit: Limit::Requests(0),
                ..ok.clone()
            },
            RunConfig {
                timeout: Duration::ZERO,
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        // The key is never serialized.
        let keyed = RunConfig {
            api_key: Some("sk-secret".into()),
            ..ok
        };
        assert!(!serde_json::to_string(&keyed).unwrap().contains("sk-secret"));
    }

    #[test]
    fn tpot_of_a_record() {
        let r = RequestRecord {
            start_s: 1.0,
            ttft_s: Some(0.1),
            itl_s: vec![0.05, 0.05],
            end_s: 1.2,
            prompt_tokens: 1,
            completion_tokens: 3,
            error: None,
        };
        assert!((r.tpot_s().unwrap() - 0.05).abs() < 1e-12);
        let one = RequestRecord {
            completion_tokens: 1,
            ..r
        };
        assert_eq!(one.tpot_s(), None);
        assert!(has_content(
            &serde_json::json!({"choices": [{"delta": {"content": "x"}}]})
        ));
        assert!(!has_content(
            &serde_json::json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
        ));
        assert!(has_content(
            &serde_json::json!({"choices": [{"text": "y"}]})
        ));
        assert!(!has_content(
            &serde_json::json!({"choices": [], "usage": {}})
        ));
    }
}
