//! pagoda-svg: the pieces Pagoda's hand-written SVG charts are drawn with, so a chart needs
//! no plotting dependency and every chart looks alike and reads whole: the document with its
//! title fitted to the width ([`document`], [`text::Title`]), axes with round ticks, labels
//! and titles and the margins they need ([`axes`]), round axis ranges ([`nice_max`],
//! [`padded_range`], [`ticks`], [`tick_label`]), XML escaping ([`escape`]), and the checker
//! every plot writer's tests run their output through ([`check`]: no text outside the
//! document, every axis ticked, labelled and titled). The charts themselves (pagoda-bench's
//! latency bars, pagoda-compress's size-against-perplexity plot) stay with the figures they
//! draw.
//!
//! Invariants: output is text only, a function of the arguments (no clock, no randomness);
//! every text a caller passes goes through [`escape`]; text sizes are estimated from the
//! character count ([`text::text_width`]), the same way when laying out and when checking.
//! Depends on no other crate.

pub mod axes;
pub mod check;
pub mod text;

pub use axes::{Axis, Frame};
pub use check::check;
pub use text::Title;

/// The opening of a chart: an `<svg>` of `width` × `height` user units (sans-serif, 12),
/// a white background, and `title` (see [`Title::fit`]) at the top. The caller starts its
/// chart below [`Title::bottom`] and appends the closing `</svg>`.
pub fn document(width: f64, height: f64, title: &Title) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{t}",
        t = title.svg(width)
    )
}

/// A round upper bound a little above the largest value (1 when all are 0): an axis from
/// zero.
pub fn nice_max(values: impl Iterator<Item = f64>) -> f64 {
    let hi = values.fold(0.0f64, f64::max);
    if hi <= 0.0 || !hi.is_finite() {
        return 1.0;
    }
    let raw = hi * 1.1;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= raw)
        .unwrap_or(10.0 * mag)
}

/// An axis range covering `values` with a tenth of their span as margin; from zero (no
/// margin below) when `from_zero`.
pub fn padded_range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if from_zero {
        lo = 0.0_f64.min(lo);
    }
    let span = (hi - lo).abs().max(hi.abs() * 0.05).max(1e-6);
    if !from_zero {
        lo -= span * 0.1;
    }
    hi += span * 0.1;
    (lo, hi)
}

/// About five round tick values (steps of 1, 2 or 5 times a power of ten) inside `range`;
/// never more than 20.
pub fn ticks(range: (f64, f64)) -> Vec<f64> {
    let raw = (range.1 - range.0) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (range.0 / step).ceil() * step;
    let mut out = Vec::new();
    while t <= range.1 + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

/// A tick's label: at most four decimals, trailing zeros dropped, never `-0`.
pub fn tick_label(t: f64) -> String {
    let s = format!("{t:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// `text` safe inside an SVG text node or a double-quoted attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_labels_short() {
        assert_eq!(ticks((0.0, 10.0)), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            ticks((0.0, 1.0)),
            [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert!(ticks((0.0, 1e9)).len() <= 20);
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(-0.00001), "0");
        assert_eq!(tick_label(250.0), "250");
    }

    #[test]
    fn ranges_cover_the_values_with_a_margin() {
        assert_eq!(nice_max([0.0].into_iter()), 1.0);
        assert_eq!(nice_max([93.0].into_iter()), 200.0);
        assert_eq!(nice_max([40.0].into_iter()), 50.0);
        assert_eq!(nice_max([f64::NAN].into_iter()), 1.0);
        let (lo, hi) = padded_range([10.0, 20.0].into_iter(), false);
        assert!((lo - 9.0).abs() < 1e-12 && (hi - 21.0).abs() < 1e-12);
        assert_eq!(padded_range([10.0, 20.0].into_iter(), true), (0.0, 22.0));
        let (lo, hi) = padded_range([5.0].into_iter(), false);
        assert!(
            lo < 5.0 && hi > 5.0,
            "a single value gets a range: {lo} {hi}"
        );
    }

    #[test]
    fn the_document_escapes_and_places_its_title() {
        let s = document(300.0, 50.0, &Title::fit("a <b> & \"c\"", 300.0));
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"300\""));
        assert!(s.contains("<text class=\"title\" x=\"150\""), "{s}");
        assert!(s.contains("a &lt;b&gt; &amp; &quot;c&quot;</text>"), "{s}");
    }
}
