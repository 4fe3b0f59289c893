//! The figures of a run: throughput, latency distributions and goodput, from the per-request
//! records the runner made.
//!
//! Definitions (they are the ones vLLM's `benchmark_serving` uses):
//! - percentiles interpolate linearly between the closest ranks (numpy's default, "linear"):
//!   for `n` sorted values `v`, the q-th percentile is at rank `r = q/100 * (n-1)`, i.e.
//!   `v[floor r] + (v[ceil r] - v[floor r]) * (r - floor r)`;
//! - TTFT: request start to the first chunk with content;
//! - TPOT, per request: `(e2e - ttft) / (completion_tokens - 1)`; requests with fewer than two
//!   completion tokens have none;
//! - ITL: every gap between consecutive content chunks of every request;
//! - E2E: request start to the end of its stream;
//! - throughput: successful requests (and their prompt and completion tokens) over the
//!   measured duration;
//! - goodput under an [`Sla`]: the share of successful requests meeting every given bound,
//!   and those requests per second. A request without a TPOT (one token) meets a TPOT bound.
//!
//! Invariants: only successful requests enter latencies, tokens and goodput; failed ones are
//! counted in `errors`. An empty distribution has `count == 0` and zeros elsewhere.

use crate::runner::RequestRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The q-th percentile (`0 <= q <= 100`) of `sorted` (ascending), numpy's linear method;
/// `None` when empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let (first, last) = (sorted.first()?, sorted.last()?);
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "input not sorted");
    let q = q.clamp(0.0, 100.0);
    if q == 0.0 {
        return Some(*first);
    }
    if q == 100.0 {
        return Some(*last);
    }
    let rank = q / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64))
}

/// The arithmetic mean; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// Mean and percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Dist {
    /// The distribution of `values` (any order; NaNs are dropped).
    pub fn of(values: &[f64]) -> Dist {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let p = |q| percentile(&v, q).unwrap_or(0.0);
        Dist {
            count: v.len(),
            mean: mean(&v).unwrap_or(0.0),
            p50: p(50.0),
            p90: p(90.0),
            p95: p(95.0),
            p99: p(99.0),
        }
    }
}

/// Latency bounds a request must meet to count towards goodput (milliseconds; `None` = no
/// bound on that figure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Sla {
    /// Whether any bound is set.
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some()
    }

    /// Whether the successful request `r` meets every bound.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let ttft_ok = match (self.ttft_ms, r.ttft_s) {
            (None, _) => true,
            (Some(b), Some(t)) => t * 1e3 <= b,
            (Some(_), None) => false,
        };
        let tpot_ok = match (self.tpot_ms, r.tpot_s()) {
            (Some(b), Some(t)) => t * 1e3 <= b,
            _ => true,
        };
        let e2e_ok = self.e2e_ms.is_none_or(|b| r.e2e_s() * 1e3 <= b);
        ttft_ok && tpot_ok && e2e_ok
    }
}

/// Goodput under an [`Sla`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub sla: Sla,
    /// Successful requests meeting every bound.
    pub met: usize,
    /// `met` over the successful requests (0 when there are none).
    pub share: f64,
    /// `met` per second of the measured duration.
    pub requests_per_s: f64,
}

/// Everything a run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Measured requests sent (warm-up excluded).
    pub requests: usize,
    /// Of those, the ones that finished without error.
    pub completed: usize,
    pub errors: usize,
    /// Error messages and how often each came (HTTP status or transport error first).
    pub error_counts: BTreeMap<String, usize>,
    /// From the first measured request's start to the last one's end.
    pub duration_s: f64,
    pub request_throughput: f64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub input_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Dist,
    pub tpot_ms: Dist,
    pub itl_ms: Dist,
    pub e2e_ms: Dist,
    pub goodput: Option<Goodput>,
}

impl Summary {
    /// The figures of `records` over `duration_s`, with goodput when `sla` sets a bound.
    pub fn from_records(records: &[RequestRecord], duration_s: f64, sla: Option<&Sla>) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.error.is_none()).collect();
        let mut error_counts = BTreeMap::new();
        for r in records {
            if let Some(e) = &r.error {
                *error_counts.entry(e.clone()).or_insert(0) += 1;
            }
        }
        let per_s = |n: f64| {
            if duration_s > 0.0 {
                n / duration_s
            } else {
                0.0
            }
        };
        let input_tokens: usize = ok.iter().map(|r| r.prompt_tokens).sum();
        let output_tokens: usize = ok.iter().map(|r| r.completion_tokens).sum();
        let ms = |s: f64| s * 1e3;
        let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s.map(ms)).collect();
        let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_s().map(ms)).collect();
        let itl: Vec<f64> = ok
            .iter()
            .flat_map(|r| r.itl_s.iter().copied().map(ms))
            .collect();
        let e2e: Vec<f64> = ok.iter().map(|r| ms(r.e2e_s())).collect();
        let goodput = sla.filter(|s| s.is_set()).map(|sla| {
            let met = ok.iter().filter(|r| sla.met_by(r)).count();
            Goodput {
                sla: *sla,
                met,
                share: if ok.is_empty() {
                    0.0
                } else {
                    met as f64 / ok.len() as f64
                },
                requests_per_s: per_s(met as f64),
            }
        });
        Summary {
            requests: records.len(),
            completed: ok.len(),
            errors: records.len() - ok.len(),
            error_counts,
            duration_s,
            request_throughput: per_s(ok.len() as f64),
            input_tokens,
            output_tokens,
            input_tokens_per_s: per_s(input_tokens as f64),
            output_tokens_per_s: per_s(output_tokens as f64),
            ttft_ms: Dist::of(&ttft),
            tpot_ms: Dist::of(&tpot),
            itl_ms: Dist::of(&itl),
            e2e_ms: Dist::of(&e2e),
            goodput,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_hand_computed_values() {
        // numpy.percentile([1, 2, 3, 4, 10], q): rank = q/100 * 4.
        let v = [1.0, 2.0, 3.0, 4.0, 10.0];
        assert!(close(percentile(&v, 50.0).unwrap(), 3.0)); // rank 2
        assert!(close(percentile(&v, 90.0).unwrap(), 7.6)); // rank 3.6: 4 + 6 * 0.6
        assert!(close(percentile(&v, 95.0).unwrap(), 8.8)); // rank 3.8: 4 + 6 * 0.8
        assert!(close(percentile(&v, 99.0).unwrap(), 9.76)); // rank 3.96: 4 + 6 * 0.96
        assert!(close(percentile(&v, 25.0).unwrap(), 2.0)); // rank 1
        assert!(close(percentile(&v, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&v, 100.0).unwrap(), 10.0));
        // An even count: the median is between the middle two.
        assert!(close(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0).unwrap(), 2.5));
        // p99 of [10, 30]: rank 0.99 -> 10 + 20 * 0.99.
        assert!(close(percentile(&[10.0, 30.0], 99.0).unwrap(), 29.8));
    }

    #[test]
    fn ties_single_and_empty() {
        let ties = [5.0, 5.0, 5.0, 7.0];
        assert!(close(percentile(&ties, 50.0).unwrap(), 5.0)); // rank 1.5 between two 5s
        assert!(close(percentile(&ties, 90.0).unwrap(), 6.4)); // rank 2.7: 5 + 2 * 0.7
        assert_eq!(percentile(&[42.0], 99.0), Some(42.0));
        assert_eq!(percentile(&[42.0], 0.0), Some(42.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(mean(&[]), None);
        let d = Dist::of(&[]);
        assert_eq!((d.count, d.mean, d.p99), (0, 0.0, 0.0));
        // Dist sorts its input itself.
        let d = Dist::of(&[10.0, 1.0, 4.0, 3.0, 2.0]);
        assert_eq!(d.count, 5);
        assert!(close(d.mean, 4.0) && close(d.p50, 3.0) && close(d.p90, 7.6));
    }

    fn record(start: f64, ttft: f64, gaps: &[f64], tokens: usize) -> RequestRecord {
        let end = start + ttft + gaps.iter().sum::<f64>();
        RequestRecord {
            start_s: start,
            ttft_s: Some(ttft),
            itl_s: gaps.to_vec(),
            end_s: end,
            prompt_tokens: 10,
            completion_tokens: tokens,
            error: None,
        }
    }

    #[test]
    fn tpot_itl_throughput_and_errors_from_records() {
        let records = vec![
            // e2e 0.1 + 0.02 + 0.04 = 0.16 s, 3 tokens: TPOT (160 - 100) / 2 = 30 ms.
            record(0.0, 0.1, &[0.02, 0.04], 3),
            // One token: no TPOT, no ITL; e2e 200 ms.
            record(1.0, 0.2, &[], 1),
            RequestRecord {
                error: Some("HTTP 500: boom".into()),
                ..record(1.5, 0.3, &[0.01], 2)
            },
        ];
        let s = Summary::from_records(&records, 2.0, None);
        assert_eq!((s.requests, s.completed, s.errors), (3, 2, 1));
        assert_eq!(s.error_counts.get("HTTP 500: boom"), Some(&1));
        assert!(close(s.request_throughput, 1.0));
        assert_eq!((s.input_tokens, s.output_tokens), (20, 4));
        assert!(close(s.output_tokens_per_s, 2.0) && close(s.input_tokens_per_s, 10.0));
        assert_eq!(s.tpot_ms.count, 1);
        assert!(close(s.tpot_ms.mean, 30.0));
        assert_eq!(s.itl_ms.count, 2);
        assert!(close(s.itl_ms.mean, 30.0) && close(s.itl_ms.p50, 30.0));
        assert!(close(s.ttft_ms.p50, 150.0) && close(s.ttft_ms.mean, 150.0));
        assert!(close(s.e2e_ms.p50, 180.0));
        assert!(s.goodput.is_none());
    }

    #[test]
    fn goodput_counts_successful_requests_meeting_every_bound() {
        let records = vec![
            record(0.0, 0.1, &[0.02, 0.04], 3), // TTFT 100, TPOT 30, E2E 160
            record(0.0, 0.3, &[0.01], 2),       // TTFT 300, TPOT 10, E2E 310
            record(0.0, 0.05, &[], 1),          // TTFT 50, no TPOT, E2E 50
            RequestRecord {
                error: Some("timeout".into()),
                ..record(0.0, 0.01, &[], 1)
            },
        ];
        let sla = Sla {
            ttft_ms: Some(200.0),
            tpot_ms: Some(20.0),
            e2e_ms: None,
        };
        let g = Summary::from_records(&records, 4.0, Some(&sla))
            .goodput
            .unwrap();
        // First: TPOT 30 > 20; second: TTFT 300 > 200; third meets both (no TPOT to miss).
        assert_eq!(g.met, 1);
        assert!(close(g.share, 1.0 / 3.0) && close(g.requests_per_s, 0.25));
        let loose = Sla {
            e2e_ms: Some(1000.0),
            ..Sla::default()
        };
        let g = Summary::from_records(&records, 4.0, Some(&loose))
            .goodput
            .unwrap();
        assert_eq!(g.met, 3);
        // No bound set: no goodput.
        assert!(Summary::from_records(&records, 4.0, Some(&Sla::default()))
            .goodput
            .is_none());
        // A request with no token at all misses a TTFT bound.
        let mut silent = record(0.0, 0.0, &[], 0);
        silent.ttft_s = None;
        assert!(!sla.met_by(&silent));
    }
}
