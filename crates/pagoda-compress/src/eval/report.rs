//! The size-against-quality report of several variants of a model: one row per variant
//! (size, bits per weight, peak memory, speed, perplexity, accuracies), deltas against the
//! baseline (the first row), rendered as a Markdown table and as an SVG scatter plot of
//! weight size (x) against perplexity (y), drawn with pagoda-svg's pieces (title fitted to
//! the width, both axes ticked and titled; the tests run it through `pagoda_svg::check`).
//!
//! The measuring is the caller's (the CLI runs each variant in its own process); this module
//! only holds the figures and renders them.
//!
//! Invariants: the baseline is `rows[0]`; a delta is `variant − baseline` (perplexity also
//! as a ratio), absent when either side lacks the figure; the SVG is self-contained and
//! every label in it is XML-escaped.

use serde::{Deserialize, Serialize};

use pagoda_svg::{axes, padded_range, Axis, Frame, Title};

use super::compare_page::escape_html;
use crate::CompressError;

/// One variant's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantRow {
    /// Label: the model, plus `:quantize` when quantized at load.
    pub name: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<String>,
    /// Size of the model file on disk.
    pub file_bytes: u64,
    /// Bytes the weight tensors take in memory (after `--quantize`; as in the file otherwise).
    pub weight_bytes: u64,
    /// Parameters (elements of every weight tensor).
    pub parameters: u64,
    /// `8 · weight_bytes / parameters`.
    pub bits_per_weight: f64,
    /// Peak resident set (VmHWM) of the process that loaded the variant and ran the speed
    /// measurement, in bytes.
    pub peak_rss_bytes: u64,
    pub load_seconds: f64,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub decode_tokens: usize,
    pub decode_tps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// Multiple-choice `acc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mc_acc: Option<f64>,
    /// Multiple-choice `acc_norm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mc_acc_norm: Option<f64>,
    /// GSM8K exact match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsm8k: Option<f64>,
}

/// A row's differences from the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deltas {
    /// `weight_bytes / baseline.weight_bytes`.
    pub size_ratio: f64,
    pub perplexity: Option<f64>,
    /// `perplexity / baseline.perplexity`.
    pub perplexity_ratio: Option<f64>,
    pub mc_acc: Option<f64>,
    pub mc_acc_norm: Option<f64>,
    pub gsm8k: Option<f64>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub rows: Vec<VariantRow>,
    /// `deltas[i]` is row `i` against row 0 (so `deltas[0]` is all zeros).
    pub deltas: Vec<Deltas>,
}

fn diff(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}

impl Report {
    /// The report of `rows`, the first being the baseline; no rows is an error.
    pub fn new(rows: Vec<VariantRow>) -> Result<Self, CompressError> {
        let base = rows.first().ok_or_else(|| {
            CompressError::InvalidInput("a report needs at least the baseline".into())
        })?;
        let deltas = rows
            .iter()
            .map(|r| Deltas {
                size_ratio: r.weight_bytes as f64 / (base.weight_bytes.max(1)) as f64,
                perplexity: diff(r.perplexity, base.perplexity),
                perplexity_ratio: r.perplexity.zip(base.perplexity).map(|(a, b)| a / b),
                mc_acc: diff(r.mc_acc, base.mc_acc),
                mc_acc_norm: diff(r.mc_acc_norm, base.mc_acc_norm),
                gsm8k: diff(r.gsm8k, base.gsm8k),
            })
            .collect();
        Ok(Report { rows, deltas })
    }

    /// The Markdown table (one row per variant, the baseline first and marked).
    pub fn markdown(&self) -> String {
        let has = |f: fn(&VariantRow) -> Option<f64>| self.rows.iter().any(|r| f(r).is_some());
        let (mc, gsm) = (has(|r| r.mc_acc), has(|r| r.gsm8k));
        let mut head = vec![
            "variant",
            "file MiB",
            "weights MiB",
            "bits/weight",
            "peak RSS MiB",
            "prefill tok/s",
            "decode tok/s",
            "perplexity",
            "Δ ppl",
        ];
        if mc {
            head.extend(["mc acc", "Δ acc", "mc acc_norm"]);
        }
        if gsm {
            head.extend(["gsm8k", "Δ gsm8k"]);
        }
        let mut out = format!("| {} |\n", head.join(" | "));
        out.push_str(&format!(
            "|{}\n",
            head.iter()
                .enumerate()
                .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
                .collect::<String>()
        ));
        let mib = |b: u64| {
            let m = b as f64 / 1_048_576.0;
            if m < 10.0 {
                format!("{m:.2}")
            } else {
                format!("{m:.1}")
            }
        };
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
        };
        let signed = |v: Option<f64>, digits: usize| {
            v.map_or("–".to_string(), |v| format!("{v:+.digits$}"))
        };
        for (i, (r, d)) in self.rows.iter().zip(&self.deltas).enumerate() {
            let name = if i == 0 {
                format!("{} (baseline)", r.name)
            } else {
                r.name.clone()
            };
            let ppl_delta = match (d.perplexity, d.perplexity_ratio) {
                _ if i == 0 => "–".to_string(),
                (Some(p), Some(ratio)) => format!("{p:+.3} ({:+.1}%)", (ratio - 1.0) * 100.0),
                _ => "–".to_string(),
            };
            let mut cells = vec![
                name.replace('|', "\\|"),
                mib(r.file_bytes),
                mib(r.weight_bytes),
                format!("{:.2}", r.bits_per_weight),
                mib(r.peak_rss_bytes),
                format!("{:.1}", r.prefill_tps),
                format!("{:.1}", r.decode_tps),
                opt(r.perplexity, 3),
                ppl_delta,
            ];
            if mc {
                cells.push(opt(r.mc_acc, 3));
                cells.push(if i == 0 {
                    "–".into()
                } else {
                    signed(d.mc_acc, 3)
                });
                cells.push(opt(r.mc_acc_norm, 3));
            }
            if gsm {
                cells.push(opt(r.gsm8k, 3));
                cells.push(if i == 0 {
                    "–".into()
                } else {
                    signed(d.gsm8k, 3)
                });
            }
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out
    }

    /// An SVG scatter plot: weight size in MiB (x) against perplexity (y), one labelled point
    /// per variant with a perplexity.
    pub fn svg(&self) -> Result<String, CompressError> {
        let points: Vec<(f64, f64, &str)> = self
            .rows
            .iter()
            .filter_map(|r| {
                Some((
                    r.weight_bytes as f64 / 1_048_576.0,
                    r.perplexity?,
                    r.name.as_str(),
                ))
            })
            .collect();
        if points.is_empty() {
            return Err(CompressError::InvalidInput(
                "no variant has a perplexity to plot".into(),
            ));
        }
        let w = 720.0;
        let title = Title::fit("Size against perplexity (lower left is better)", w);
        let x = Axis::numeric(
            padded_range(points.iter().map(|p| p.0), true),
            "weights in memory (MiB)",
        );
        let y = Axis::numeric(
            padded_range(points.iter().map(|p| p.1), false),
            "perplexity",
        );
        let (left, below) = axes::margins(&y);
        let f = Frame {
            left,
            top: title.bottom() + 14.0,
            width: w - left - 30.0,
            height: 340.0,
        };
        let h = f.bottom() + below + 8.0;
        let mut s = pagoda_svg::document(w, h, &title);
        f.draw_axes(&mut s, &x, &y, "size-ppl", true);
        for (i, (px, py, name)) in points.iter().enumerate() {
            let (cx, cy) = (f.x(&x, *px), f.y(&y, *py));
            let color = if i == 0 { "#c0392b" } else { "#2c6fbb" };
            // A label goes right of its point when it fits inside the plot, else left of it.
            let width = pagoda_svg::text::text_width(name, 12.0);
            let (lx, anchor) = if cx + 8.0 + width <= f.right() {
                (cx + 8.0, "start")
            } else {
                ((cx - 8.0).max(f.left + width), "end")
            };
            s.push_str(&format!(
                "<circle class=\"point\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"5\" fill=\"{color}\">\
                 <title>{label}: {px:.1} MiB, perplexity {py:.3}</title></circle>\
                 <text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"{anchor}\">{label}</text>\n",
                label = escape_html(name),
                ly = (cy - 8.0).max(f.top + 12.0),
            ));
        }
        s.push_str("</svg>\n");
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, mib: u64, ppl: Option<f64>, acc: Option<f64>) -> VariantRow {
        VariantRow {
            name: name.into(),
            model: "m".into(),
            quantize: None,
            file_bytes: mib << 20,
            weight_bytes: mib << 20,
            parameters: 1000,
            bits_per_weight: 4.5,
            peak_rss_bytes: (3 * mib) << 20,
            load_seconds: 0.1,
            prefill_tokens: 64,
            prefill_tps: 100.0,
            decode_tokens: 16,
            decode_tps: 20.0,
            perplexity: ppl,
            mc_acc: acc,
            mc_acc_norm: acc,
            gsm8k: None,
        }
    }

    #[test]
    fn deltas_are_against_the_first_row() {
        let r = Report::new(vec![
            row("base", 100, Some(10.0), Some(0.5)),
            row("q4 <x>", 50, Some(11.0), Some(0.25)),
        ])
        .unwrap();
        assert_eq!(r.deltas[1].perplexity, Some(1.0));
        assert!((r.deltas[1].perplexity_ratio.unwrap() - 1.1).abs() < 1e-12);
        assert_eq!(r.deltas[1].mc_acc, Some(-0.25));
        assert_eq!(r.deltas[1].size_ratio, 0.5);
        let md = r.markdown();
        assert!(md.contains("| base (baseline) | 100.0 |"), "{md}");
        assert!(md.contains("+1.000 (+10.0%)"), "{md}");
        assert!(md.contains("-0.250"), "{md}");
        assert!(
            !md.contains("gsm8k"),
            "no GSM8K column without figures: {md}"
        );
        assert_eq!(md.lines().count(), 4);
        let svg = r.svg().unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("class=\"point\"").count(), 2);
        assert!(svg.contains("q4 &lt;x&gt;") && !svg.contains("<x>"));
        pagoda_svg::check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
        assert!(Report::new(vec![]).is_err());
    }

    #[test]
    fn a_single_point_plots_and_no_perplexity_is_an_error() {
        let r = Report::new(vec![row("only", 1, Some(3.0), None)]).unwrap();
        let svg = r.svg().unwrap();
        assert_eq!(svg.matches("class=\"point\"").count(), 1);
        pagoda_svg::check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
        let r = Report::new(vec![row("none", 1, None, None)]).unwrap();
        assert!(r.svg().is_err());
    }

    #[test]
    fn long_names_at_the_edges_stay_inside_the_plot() {
        let r = Report::new(vec![
            row(
                "qwen2.5-coder:1.5b-instruct (baseline, Q8_0)",
                1,
                Some(3.0),
                None,
            ),
            row(
                "a-very-long-variant-name-on-the-right-edge.gguf",
                900,
                Some(9.0),
                None,
            ),
            row("middle", 450, Some(6.0), None),
        ])
        .unwrap();
        let svg = r.svg().unwrap();
        let checked = pagoda_svg::check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
        assert_eq!(checked.axes.len(), 2);
    }
}
