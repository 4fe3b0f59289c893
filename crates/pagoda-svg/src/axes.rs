//! A chart's plot area and its two axes: round ticks (steps of 1, 2 or 5 times a power of
//! ten) or named categories, a tick mark and a label at each, light grid lines, and each
//! axis's title with its unit; the margins around the plot area are computed from the
//! widths of those labels, so nothing is drawn outside the document.
//!
//! Every element carries what [`crate::check`] reads back: tick marks are
//! `<line class="tick" data-axis="ID">`, their labels `<text class="tick-label"
//! data-axis="ID">`, the axis's title `<text class="axis-title" data-axis="ID">`.
//!
//! Invariants: a numeric axis has at least two ticks (its range is widened to round values
//! when the data would give fewer); labels never overlap their neighbours' (every other
//! label is dropped until they fit, the tick marks stay).

use crate::text::{text_width, ASCENT_EM};
use crate::{escape, tick_label, ticks};

/// Font size of tick labels (the document's default).
pub const LABEL_SIZE: f64 = 12.0;
/// Font size of axis titles.
pub const AXIS_TITLE_SIZE: f64 = 12.0;
/// Length of a tick mark, outside the plot area.
pub const TICK_LEN: f64 = 5.0;
/// Space between a tick mark and its label, and between labels and the axis title.
pub const GAP: f64 = 6.0;

/// One axis: its value range, ticks (value and label) and title.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub range: (f64, f64),
    pub ticks: Vec<(f64, String)>,
    /// What is measured, with its unit: `time since the first request (s)`.
    pub title: String,
}

impl Axis {
    /// A numeric axis over `range` with round ticks; a range with fewer than two round
    /// values inside is widened to the round values around it.
    pub fn numeric(range: (f64, f64), title: &str) -> Axis {
        let (mut lo, mut hi) = range;
        if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
            let c = if lo.is_finite() { lo } else { 0.0 };
            (lo, hi) = (c - 0.5, c + 0.5);
        }
        let mut t = ticks((lo, hi));
        if t.len() < 2 {
            let step = ticks((lo - (hi - lo), hi + (hi - lo)))
                .windows(2)
                .map(|w| w[1] - w[0])
                .next()
                .unwrap_or(1.0);
            lo = (lo / step).floor() * step;
            hi = (hi / step).ceil() * step;
            t = ticks((lo, hi));
        }
        Axis {
            range: (lo, hi),
            ticks: t.into_iter().map(|v| (v, tick_label(v))).collect(),
            title: title.to_string(),
        }
    }

    /// A category axis: `labels` at the middle of equal slots, slot `i` spanning `i..i+1`.
    pub fn categories(labels: &[&str], title: &str) -> Axis {
        Axis {
            range: (0.0, labels.len().max(1) as f64),
            ticks: labels
                .iter()
                .enumerate()
                .map(|(i, l)| (i as f64 + 0.5, l.to_string()))
                .collect(),
            title: title.to_string(),
        }
    }

    /// The widest tick label.
    pub fn label_width(&self) -> f64 {
        self.ticks
            .iter()
            .map(|(_, l)| text_width(l, LABEL_SIZE))
            .fold(0.0, f64::max)
    }

    /// `v`'s place between `from` (the range's start) and `to` (its end).
    fn place(&self, v: f64, from: f64, to: f64) -> f64 {
        from + (v - self.range.0) / (self.range.1 - self.range.0) * (to - from)
    }
}

/// Room the axes need around a plot area: left of it (the y labels and title) and below it
/// (the x labels and title).
pub fn margins(y: &Axis) -> (f64, f64) {
    let left = TICK_LEN + GAP + y.label_width() + GAP + AXIS_TITLE_SIZE + GAP;
    let bottom = TICK_LEN + GAP + LABEL_SIZE + GAP + AXIS_TITLE_SIZE + GAP;
    (left, bottom)
}

/// A plot area in document coordinates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

impl Frame {
    pub fn bottom(&self) -> f64 {
        self.top + self.height
    }

    pub fn right(&self) -> f64 {
        self.left + self.width
    }

    /// The document x of value `v` on `x`.
    pub fn x(&self, x: &Axis, v: f64) -> f64 {
        x.place(v, self.left, self.right())
    }

    /// The document y of value `v` on `y`.
    pub fn y(&self, y: &Axis, v: f64) -> f64 {
        y.place(v, self.bottom(), self.top)
    }

    /// Draws both axes of the plot area: grid lines (horizontal always, vertical when
    /// `x_grid`), tick marks and labels, the axis lines and titles. `id` names the chart
    /// in the `data-axis` attributes (`ID-x`, `ID-y`).
    pub fn draw_axes(&self, s: &mut String, x: &Axis, y: &Axis, id: &str, x_grid: bool) {
        let (left, right, top, bottom) = (self.left, self.right(), self.top, self.bottom());
        // y: grid, tick, label right-aligned left of the tick.
        for (v, label) in &y.ticks {
            let py = self.y(y, *v);
            s.push_str(&format!(
                "<line x1=\"{left}\" y1=\"{py:.1}\" x2=\"{right}\" y2=\"{py:.1}\" stroke=\"#eee\"/>\
                 <line class=\"tick\" data-axis=\"{id}-y\" x1=\"{tx:.1}\" y1=\"{py:.1}\" \
                 x2=\"{left}\" y2=\"{py:.1}\" stroke=\"black\"/>\
                 <text class=\"tick-label\" data-axis=\"{id}-y\" x=\"{lx:.1}\" y=\"{ly:.1}\" \
                 text-anchor=\"end\">{l}</text>\n",
                tx = left - TICK_LEN,
                lx = left - TICK_LEN - GAP,
                ly = py + LABEL_SIZE * 0.35,
                l = escape(label),
            ));
        }
        // x: labels thinned until neighbours do not overlap.
        let spacing = if x.ticks.len() > 1 {
            (self.x(x, x.ticks[1].0) - self.x(x, x.ticks[0].0)).abs()
        } else {
            f64::INFINITY
        };
        let mut every = 1;
        while (x.label_width() + GAP) > spacing * every as f64 && every < x.ticks.len() {
            every += 1;
        }
        for (i, (v, label)) in x.ticks.iter().enumerate() {
            let px = self.x(x, *v);
            if x_grid {
                s.push_str(&format!(
                    "<line x1=\"{px:.1}\" y1=\"{top}\" x2=\"{px:.1}\" y2=\"{bottom}\" stroke=\"#eee\"/>"
                ));
            }
            s.push_str(&format!(
                "<line class=\"tick\" data-axis=\"{id}-x\" x1=\"{px:.1}\" y1=\"{bottom}\" \
                 x2=\"{px:.1}\" y2=\"{tb}\" stroke=\"black\"/>",
                tb = bottom + TICK_LEN,
            ));
            if i % every == 0 {
                s.push_str(&format!(
                    "<text class=\"tick-label\" data-axis=\"{id}-x\" x=\"{px:.1}\" y=\"{ly:.1}\" \
                     text-anchor=\"middle\">{l}</text>",
                    ly = bottom + TICK_LEN + GAP + LABEL_SIZE * ASCENT_EM,
                    l = escape(label),
                ));
            }
            s.push('\n');
        }
        // Axis lines and titles.
        let (_, below) = margins(y);
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"black\"/>\
             <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"black\"/>\n\
             <text class=\"axis-title\" data-axis=\"{id}-x\" x=\"{xm:.1}\" y=\"{xt:.1}\" \
             text-anchor=\"middle\" font-size=\"{size}\">{xl}</text>\n\
             <text class=\"axis-title\" data-axis=\"{id}-y\" \
             transform=\"translate({yx:.1} {ym:.1}) rotate(-90)\" text-anchor=\"middle\" \
             font-size=\"{size}\">{yl}</text>\n",
            xm = (left + right) / 2.0,
            xt = bottom + below - GAP - AXIS_TITLE_SIZE * 0.25,
            yx = left - TICK_LEN - GAP - y.label_width() - GAP,
            ym = (top + bottom) / 2.0,
            size = AXIS_TITLE_SIZE,
            xl = escape(&x.title),
            yl = escape(&y.title),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numeric_axis_always_has_two_round_ticks() {
        let a = Axis::numeric((0.0, 10.0), "v");
        assert_eq!(a.ticks.len(), 6);
        assert_eq!(a.ticks[1], (2.0, "2".to_string()));
        for range in [
            (5.0, 5.0),
            (0.0, 0.0),
            (f64::NAN, 1.0),
            (0.91, 1.09),
            (3.0, 2.0),
        ] {
            let a = Axis::numeric(range, "v");
            assert!(a.ticks.len() >= 2, "{range:?}: {a:?}");
            assert!(a.range.0 < a.range.1);
            for (v, _) in &a.ticks {
                assert!(
                    *v >= a.range.0 - 1e-9 && *v <= a.range.1 + 1e-9,
                    "{range:?}: {a:?}"
                );
            }
        }
    }

    #[test]
    fn categories_sit_in_the_middle_of_their_slots() {
        let a = Axis::categories(&["p50", "p90", "p99"], "percentile");
        let f = Frame {
            left: 10.0,
            top: 0.0,
            width: 30.0,
            height: 10.0,
        };
        let xs: Vec<f64> = a.ticks.iter().map(|(v, _)| f.x(&a, *v)).collect();
        assert_eq!(xs, [15.0, 25.0, 35.0]);
    }

    #[test]
    fn crowded_x_labels_are_thinned_but_every_tick_is_marked() {
        let x = Axis::numeric((0.0, 1_000_000.0), "bytes");
        let y = Axis::numeric((0.0, 1.0), "share");
        let f = Frame {
            left: 60.0,
            top: 10.0,
            width: 80.0,
            height: 50.0,
        };
        let mut s = String::new();
        f.draw_axes(&mut s, &x, &y, "c", true);
        let marks = s.matches("class=\"tick\" data-axis=\"c-x\"").count();
        let labels = s.matches("class=\"tick-label\" data-axis=\"c-x\"").count();
        assert_eq!(marks, x.ticks.len());
        assert!(labels < marks && labels >= 2, "{labels} of {marks}");
    }
}
