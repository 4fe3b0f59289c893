//! The outputs of a run: a Markdown table for people, a JSON document for programs (the
//! configuration, the workload and the full [`Summary`]), and a hand-written SVG chart —
//! p50/p90/p99 of TTFT, TPOT and E2E as grouped bars (one panel each, its own scale), and
//! completed requests per second over the run, drawn with pagoda-svg's pieces.
//!
//! Invariants: nothing here measures or prints; the API key is never in any output
//! ([`RunConfig`] does not serialize it).

use crate::runner::{RequestRecord, RunConfig};
use crate::stats::{Dist, Summary};
use crate::workload::Workload;
use pagoda_svg::{escape, nice_max};
use serde_json::{json, Value};

/// The summary as Markdown tables: the totals and throughput, then one row per latency.
pub fn table(summary: &Summary, title: &str) -> String {
    let s = summary;
    let mut out = format!("## {title}\n\n| metric | value |\n|---|---:|\n");
    let mut row = |k: &str, v: String| out.push_str(&format!("| {k} | {v} |\n"));
    row("requests (measured)", s.requests.to_string());
    row("successful", s.completed.to_string());
    row("errors", s.errors.to_string());
    row("duration (s)", format!("{:.2}", s.duration_s));
    row(
        "request throughput (req/s)",
        format!("{:.2}", s.request_throughput),
    );
    row("input tokens", s.input_tokens.to_string());
    row("output tokens", s.output_tokens.to_string());
    row("input tokens/s", format!("{:.1}", s.input_tokens_per_s));
    row("output tokens/s", format!("{:.1}", s.output_tokens_per_s));
    if let Some(g) = &s.goodput {
        let mut bounds = Vec::new();
        if let Some(b) = g.sla.ttft_ms {
            bounds.push(format!("TTFT <= {b} ms"));
        }
        if let Some(b) = g.sla.tpot_ms {
            bounds.push(format!("TPOT <= {b} ms"));
        }
        if let Some(b) = g.sla.e2e_ms {
            bounds.push(format!("E2E <= {b} ms"));
        }
        row(
            &format!("goodput ({})", bounds.join(", ")),
            format!(
                "{:.2} req/s, {}/{} requests ({:.1}%)",
                g.requests_per_s,
                g.met,
                s.completed,
                g.share * 100.0
            ),
        );
    }
    out.push_str("\n| latency (ms) | n | mean | p50 | p90 | p95 | p99 |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for (name, d) in [
        ("TTFT", &s.ttft_ms),
        ("TPOT", &s.tpot_ms),
        ("ITL", &s.itl_ms),
        ("E2E", &s.e2e_ms),
    ] {
        out.push_str(&dist_row(name, d));
    }
    if !s.error_counts.is_empty() {
        out.push_str("\n| error | count |\n|---|---:|\n");
        for (e, n) in &s.error_counts {
            out.push_str(&format!("| {} | {n} |\n", e.replace('|', "\\|")));
        }
    }
    out
}

fn dist_row(name: &str, d: &Dist) -> String {
    if d.count == 0 {
        return format!("| {name} | 0 | – | – | – | – | – |\n");
    }
    format!(
        "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
        d.count, d.mean, d.p50, d.p90, d.p95, d.p99
    )
}

/// The JSON document of `--json`: tool, configuration, workload, SLA, summary.
pub fn json_report(config: &RunConfig, workload: &Workload, summary: &Summary) -> Value {
    json!({
        "tool": "pagoda bench serve",
        "version": env!("CARGO_PKG_VERSION"),
        "config": config,
        "workload": { "source": workload.label(), "model": workload.model() },
        "summary": summary,
    })
}

/// Completed requests in each `bin_s`-second bin from 0 to the last end.
pub fn completions_per_bin(records: &[RequestRecord], bin_s: f64) -> Vec<usize> {
    let ok = || records.iter().filter(|r| r.error.is_none());
    let first = ok().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let last = ok().map(|r| r.end_s).fold(0.0, f64::max);
    if !first.is_finite() || bin_s <= 0.0 {
        return Vec::new();
    }
    let n = (((last - first) / bin_s).floor() as usize) + 1;
    let mut bins = vec![0; n];
    for r in ok() {
        let i = (((r.end_s - first) / bin_s).floor() as usize).min(n - 1);
        bins[i] += 1;
    }
    bins
}

/// The chart of `--plot`, as SVG text.
pub fn svg(summary: &Summary, records: &[RequestRecord], title: &str) -> String {
    let (w, h) = (900.0, 620.0);
    let mut s = pagoda_svg::document(w, h, title, 24.0);
    // Top: three latency panels, bars p50/p90/p99.
    let colors = ["#2c6fbb", "#e67e22", "#c0392b"];
    let panels = [
        ("TTFT (ms)", &summary.ttft_ms),
        ("TPOT (ms)", &summary.tpot_ms),
        ("E2E (ms)", &summary.e2e_ms),
    ];
    let (top, ph, pw) = (60.0, 200.0, 230.0);
    for (k, (name, d)) in panels.iter().enumerate() {
        let left = 70.0 + k as f64 * (pw + 60.0);
        let values = [d.p50, d.p90, d.p99];
        let range = (0.0, nice_max(values.iter().copied()));
        let py = |v: f64| top + ph - v / range.1 * ph;
        axes(&mut s, left, top, pw, ph, range, name);
        let bar_w = pw / 4.0;
        for (j, (label, v)) in ["p50", "p90", "p99"].iter().zip(values).enumerate() {
            let x = left + bar_w * (j as f64 + 0.5);
            let y = py(v);
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{c}\">\
                 <title>{name} {label}: {v:.1}</title></rect>\
                 <text x=\"{tx:.1}\" y=\"{ly:.1}\" text-anchor=\"middle\">{label}</text>\
                 <text x=\"{tx:.1}\" y=\"{vy:.1}\" text-anchor=\"middle\" font-size=\"10\">{v:.1}</text>\n",
                bw = bar_w * 0.8,
                bh = (top + ph - y).max(0.0),
                c = colors[j],
                tx = x + bar_w * 0.4,
                ly = top + ph + 16.0,
                vy = y - 4.0,
            ));
        }
        if d.count == 0 {
            s.push_str(&format!(
                "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\">no data</text>\n",
                x = left + pw / 2.0,
                y = top + ph / 2.0
            ));
        }
    }
    // Bottom: completed requests per second over time.
    let bin_s = bin_width(summary.duration_s);
    let bins = completions_per_bin(records, bin_s);
    let rates: Vec<f64> = bins.iter().map(|&n| n as f64 / bin_s).collect();
    let (left, top, pw, ph) = (70.0, 360.0, 790.0, 200.0);
    let range = (0.0, nice_max(rates.iter().copied()));
    axes(
        &mut s,
        left,
        top,
        pw,
        ph,
        range,
        &format!("completed requests/s ({bin_s} s bins)"),
    );
    let n = rates.len().max(1) as f64;
    for (i, r) in rates.iter().enumerate() {
        let x = left + pw * i as f64 / n;
        let bh = r / range.1 * ph;
        s.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"#27ae60\">\
             <title>{t0:.0}-{t1:.0} s: {r:.2} req/s</title></rect>\n",
            y = top + ph - bh,
            bw = (pw / n * 0.9).max(0.5),
            t0 = i as f64 * bin_s,
            t1 = (i + 1) as f64 * bin_s,
        ));
    }
    s.push_str(&format!(
        "<text x=\"{x}\" y=\"{y}\" text-anchor=\"middle\">time since the first request (s), \
         0 to {d:.1}</text>\n</svg>\n",
        x = left + pw / 2.0,
        y = top + ph + 36.0,
        d = summary.duration_s
    ));
    s
}

/// Bin width: 1 s, or wider so that a long run has at most 60 bins.
fn bin_width(duration_s: f64) -> f64 {
    let mut b = 1.0;
    while duration_s / b > 60.0 {
        b *= 2.0;
    }
    b
}

/// Axes, grid, ticks and a title above a panel at (`left`, `top`) of size `pw` × `ph`.
fn axes(s: &mut String, left: f64, top: f64, pw: f64, ph: f64, range: (f64, f64), title: &str) {
    let to_y = |t: f64| top + ph - (t - range.0) / (range.1 - range.0) * ph;
    pagoda_svg::y_grid(s, range, to_y, left, left + pw, left - 6.0);
    s.push_str(&format!(
        "<line x1=\"{left}\" y1=\"{yb}\" x2=\"{xr}\" y2=\"{yb}\" stroke=\"black\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{yb}\" stroke=\"black\"/>\
         <text x=\"{xm}\" y=\"{yt}\" text-anchor=\"middle\" font-size=\"13\">{t}</text>\n",
        yb = top + ph,
        xr = left + pw,
        xm = left + pw / 2.0,
        yt = top - 10.0,
        t = escape(title),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Sla;

    fn rec(start: f64, end: f64, error: bool) -> RequestRecord {
        RequestRecord {
            start_s: start,
            ttft_s: Some((end - start) / 2.0),
            itl_s: vec![(end - start) / 4.0; 2],
            end_s: end,
            prompt_tokens: 4,
            completion_tokens: 3,
            error: error.then(|| "HTTP 500: x".to_string()),
        }
    }

    #[test]
    fn bins_count_completions_by_end_time() {
        let records = [
            rec(0.0, 0.5, false),
            rec(0.1, 0.9, false),
            rec(0.2, 2.5, false),
            rec(0.3, 1.5, true),
        ];
        assert_eq!(completions_per_bin(&records, 1.0), vec![2, 0, 1]);
        assert!(completions_per_bin(&[], 1.0).is_empty());
        assert_eq!(bin_width(30.0), 1.0);
        assert_eq!(bin_width(200.0), 4.0);
    }

    #[test]
    fn table_json_and_svg_carry_the_figures() {
        let records = [
            rec(0.0, 0.5, false),
            rec(0.1, 0.9, false),
            rec(0.2, 1.0, true),
        ];
        let sla = Sla {
            ttft_ms: Some(300.0),
            ..Sla::default()
        };
        let summary = Summary::from_records(&records, 1.0, Some(&sla));
        let t = table(&summary, "bench <x>");
        for needle in [
            "| successful | 2 |",
            "| errors | 1 |",
            "| TTFT | 2 |",
            "goodput (TTFT <= 300 ms)",
            "| HTTP 500: x | 1 |",
        ] {
            assert!(t.contains(needle), "{needle} in\n{t}");
        }
        let svg = svg(&summary, &records, "bench <x>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("bench &lt;x&gt;") && svg.contains("TPOT (ms)"));
        assert_eq!(svg.matches("fill=\"#27ae60\"").count(), 1);
        assert_eq!(nice_max([0.0].into_iter()), 1.0);
        assert_eq!(nice_max([93.0].into_iter()), 200.0); // 93 * 1.1 rounded up
        assert_eq!(nice_max([40.0].into_iter()), 50.0);
    }
}
