//! pagoda-svg: the pieces Pagoda's hand-written SVG charts are drawn with, so a chart needs
//! no plotting dependency and every chart looks alike: the document with its title
//! ([`document`]), round axis ranges ([`nice_max`], [`padded_range`]), about five round
//! ticks ([`ticks`], [`tick_label`]), horizontal grid lines with their labels ([`y_grid`]),
//! and XML escaping ([`escape`]). The charts themselves (pagoda-bench's latency bars,
//! pagoda-compress's size-against-perplexity plot) stay with the figures they draw.
//!
//! Invariants: output is text only, a function of the arguments (no clock, no randomness);
//! every text a caller passes as a title goes through [`escape`]. Depends on no other crate.

/// The opening of a chart: an `<svg>` of `width` × `height` user units (sans-serif, 12),
/// a white background, and `title` (escaped) centred at height `title_y`. The caller
/// appends the chart and the closing `</svg>`.
pub fn document(width: f64, height: f64, title: &str, title_y: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{cx}\" y=\"{title_y}\" text-anchor=\"middle\" font-size=\"15\">{t}</text>\n",
        cx = width / 2.0,
        t = escape(title)
    )
}

/// A light horizontal grid line from `left` to `right` at each of [`ticks`]`(range)`, with
/// the tick's label right-aligned at `label_x`; `to_y` maps a value to its height.
pub fn y_grid(
    s: &mut String,
    range: (f64, f64),
    to_y: impl Fn(f64) -> f64,
    left: f64,
    right: f64,
    label_x: f64,
) {
    for t in ticks(range) {
        let y = to_y(t);
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{right}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{label_x}\" y=\"{yt:.1}\" text-anchor=\"end\">{t}</text>\n",
            yt = y + 4.0,
            t = tick_label(t),
        ));
    }
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
    fn the_document_and_grid_escape_and_place_their_text() {
        let mut s = document(100.0, 50.0, "a <b> & \"c\"", 20.0);
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\""));
        assert!(s.contains("<text x=\"50\" y=\"20\""), "{s}");
        assert!(s.contains("a &lt;b&gt; &amp; &quot;c&quot;</text>"), "{s}");
        let before = s.len();
        y_grid(&mut s, (0.0, 10.0), |v| 40.0 - v, 5.0, 95.0, 3.0);
        let grid = &s[before..];
        assert_eq!(grid.lines().count(), 6, "{grid}");
        assert!(grid.starts_with(
            "<line x1=\"5\" y1=\"40.0\" x2=\"95\" y2=\"40.0\" stroke=\"#eee\"/>\
             <text x=\"3\" y=\"44.0\" text-anchor=\"end\">0</text>\n"
        ));
    }
}
