//! The outputs of a run: a Markdown table for people, a JSON document for programs (the
//! configuration, the workload and the full [`Summary`]), and a hand-written SVG chart —
//! p50/p90/p99 of TTFT, TPOT and E2E as grouped bars (one panel each, its own scale), and
//! completed requests per second over the run, drawn with pagoda-svg's pieces (its title
//! fitted to the width, every axis ticked and titled with its unit, checked by
//! `pagoda_svg::check` in the tests).
//!
//! Invariants: nothing here measures or prints; the API key is never in any output
//! ([`RunConfig`] does not serialize it).

use crate::runner::{RequestRecord, RunConfig};
use crate::stats::{Dist, Summary};
use crate::workload::Workload;
use pagoda_svg::{axes, escape, nice_max, Axis, Frame, Title};
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

/// The chart of `--plot`, as SVG text: the title fitted to the width, three latency panels
/// (p50/p90/p99 bars, each on its own scale in ms), then completed requests per second
/// over the run's time in seconds; every axis ticked, labelled and titled (pagoda-svg).
pub fn svg(summary: &Summary, records: &[RequestRecord], title: &str) -> String {
    let w = 900.0;
    let title = Title::fit(title, w);
    let right_pad = 20.0;
    // Top: three latency panels, bars p50/p90/p99.
    let colors = ["#2c6fbb", "#e67e22", "#c0392b"];
    let panels = [
        ("TTFT: time to first token", &summary.ttft_ms),
        ("TPOT: time per output token", &summary.tpot_ms),
        ("E2E: request latency", &summary.e2e_ms),
    ];
    let percentiles = ["p50", "p90", "p99"];
    let x_axis = Axis::categories(&percentiles, "percentile");
    let y_axes: Vec<Axis> = panels
        .iter()
        .map(|(_, d)| Axis::numeric((0.0, nice_max([d.p50, d.p90, d.p99].into_iter())), "ms"))
        .collect();
    let (_, below) = axes::margins(&y_axes[0]);
    let top = title.bottom() + HEADER;
    let ph = 200.0;
    let slot = (w - right_pad) / panels.len() as f64;
    let mut panel_frames = Vec::new();
    for y in &y_axes {
        let (left, _) = axes::margins(y);
        let k = panel_frames.len() as f64;
        panel_frames.push(Frame {
            left: k * slot + left,
            top,
            width: slot - left - 10.0,
            height: ph,
        });
    }
    // Bottom: completed requests per second over time.
    let bin_s = bin_width(summary.duration_s);
    let bins = completions_per_bin(records, bin_s);
    let rates: Vec<f64> = bins.iter().map(|&n| n as f64 / bin_s).collect();
    let span = (rates.len() as f64 * bin_s)
        .max(summary.duration_s)
        .max(bin_s);
    let time = Axis::numeric((0.0, span), "time since the first request (s)");
    let rate = Axis::numeric(
        (0.0, nice_max(rates.iter().copied())),
        "completed requests/s",
    );
    let (rate_left, rate_below) = axes::margins(&rate);
    let time_frame = Frame {
        left: rate_left,
        top: top + ph + below + HEADER,
        width: w - rate_left - right_pad,
        height: 200.0,
    };
    let h = time_frame.bottom() + rate_below + 10.0;
    let mut s = pagoda_svg::document(w, h, &title);
    for (k, (((name, d), y), f)) in panels.iter().zip(&y_axes).zip(&panel_frames).enumerate() {
        header(&mut s, f, name);
        f.draw_axes(&mut s, &x_axis, y, &format!("latency{k}"), false);
        let bar_w = f.width / percentiles.len() as f64;
        for (j, (label, v)) in percentiles.iter().zip([d.p50, d.p90, d.p99]).enumerate() {
            let yv = f.y(y, v);
            let cx = f.x(&x_axis, j as f64 + 0.5);
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{yv:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{c}\">\
                 <title>{name} {label}: {v:.1} ms</title></rect>\
                 <text x=\"{cx:.1}\" y=\"{vy:.1}\" text-anchor=\"middle\" font-size=\"10\">{v:.1}</text>\n",
                x = cx - bar_w * 0.35,
                bw = bar_w * 0.7,
                bh = (f.bottom() - yv).max(0.0),
                c = colors[j],
                vy = yv - 4.0,
            ));
        }
        if d.count == 0 {
            s.push_str(&format!(
                "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\">no data</text>\n",
                x = f.left + f.width / 2.0,
                y = f.top + f.height / 2.0
            ));
        }
    }
    let f = &time_frame;
    header(
        &mut s,
        f,
        &format!("Completed requests per second ({bin_s} s bins)"),
    );
    f.draw_axes(&mut s, &time, &rate, "rate", true);
    for (i, r) in rates.iter().enumerate() {
        let (t0, t1) = (i as f64 * bin_s, (i + 1) as f64 * bin_s);
        let x0 = f.x(&time, t0);
        let y = f.y(&rate, *r);
        s.push_str(&format!(
            "<rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"#27ae60\">\
             <title>{t0:.0}-{t1:.0} s: {r:.2} req/s</title></rect>\n",
            bw = ((f.x(&time, t1) - x0) * 0.9).max(0.5),
            bh = (f.bottom() - y).max(0.0),
        ));
    }
    s.push_str("</svg>\n");
    s
}

/// Room above a panel for its header.
const HEADER: f64 = 28.0;

/// A panel's header, left-aligned above it (cut to the panel's width).
fn header(s: &mut String, f: &Frame, text: &str) {
    let size = 13.0;
    let fit = (f.width / (size * pagoda_svg::text::CHAR_WIDTH_EM)).floor() as usize;
    let shown: String = if text.chars().count() > fit {
        text.chars()
            .take(fit.saturating_sub(1))
            .chain(['…'])
            .collect()
    } else {
        text.to_string()
    };
    s.push_str(&format!(
        "<text x=\"{x}\" y=\"{y}\" font-size=\"{size}\">{t}</text>\n",
        x = f.left,
        y = f.top - 10.0,
        t = escape(&shown),
    ));
}

/// Bin width: 1 s, or wider so that a long run has at most 60 bins.
fn bin_width(duration_s: f64) -> f64 {
    let mut b = 1.0;
    while duration_s / b > 60.0 {
        b *= 2.0;
    }
    b
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
        assert!(svg.contains("bench &lt;x&gt;") && svg.contains("TPOT: time per output token"));
        assert_eq!(svg.matches("fill=\"#27ae60\"").count(), 1);
        pagoda_svg::check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
        assert_eq!(nice_max([0.0].into_iter()), 1.0);
        assert_eq!(nice_max([93.0].into_iter()), 200.0); // 93 * 1.1 rounded up
        assert_eq!(nice_max([40.0].into_iter()), 50.0);
    }

    #[test]
    fn the_chart_reads_whole_for_long_titles_long_runs_and_no_data() {
        let long_title = "pagoda bench serve: http://127.0.0.1:41234 (qwen2.5-coder:1.5b-instruct-q4_k_m), \
                          sharegpt prompts from /data/ShareGPT_V3_unfiltered_cleaned_split.json (500), \
                          Poisson arrivals at 8 req/s";
        let many: Vec<RequestRecord> = (0..400)
            .map(|i| rec(i as f64 * 0.5, i as f64 * 0.5 + 3.0, i % 7 == 0))
            .collect();
        let none: Vec<RequestRecord> = vec![rec(0.0, 1.0, true)];
        for (records, title) in [
            (&many[..], long_title),
            (&none[..], "x"),
            (&many[..5], "short"),
        ] {
            let summary = Summary::from_records(records, 1.0, None);
            let svg = svg(&summary, records, title);
            let checked = pagoda_svg::check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
            // Three latency panels and the rate chart, two axes each.
            assert_eq!(checked.axes.len(), 8, "{:?}", checked.axes);
        }
    }
}
