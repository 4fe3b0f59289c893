//! Reads back a chart this crate drew and says what a reader would find wrong with it:
//! text outside the document (a clipped title or label), an axis with fewer than two
//! labelled ticks, an axis without a title, a chart without a title. Every plot writer's
//! tests run their output through [`check`]; scripts/conformance/svg_plots.py makes the same
//! checks in a browser with the real font.
//!
//! Understands the SVG this crate writes, not SVG at large: `<text>` with `x`, `y`,
//! `text-anchor`, `font-size` and a `translate(X Y) rotate(-90)` transform; the marks of
//! [`crate::axes`] (`class` and `data-axis`). Text boxes are estimated with
//! [`crate::text::text_width`].
//!
//! Invariants: never panics on any input; an input it cannot read is a problem reported,
//! not a pass.

use crate::text::{text_width, ASCENT_EM, DESCENT_EM};
use std::collections::BTreeMap;

/// What [`check`] found in a chart that passed.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The document's size (its viewBox).
    pub width: f64,
    pub height: f64,
    /// Text elements measured.
    pub texts: usize,
    /// The axes by `data-axis` name, each with its labelled tick count.
    pub axes: BTreeMap<String, usize>,
}

/// One `<text>` element as read back.
#[derive(Debug, Clone)]
struct Text {
    attrs: BTreeMap<String, String>,
    content: String,
}

/// Checks `svg` (see the module doc); every problem found, one sentence each, when any.
pub fn check(svg: &str) -> Result<Checked, Vec<String>> {
    let mut problems = Vec::new();
    let Some((width, height, default_size)) = root(svg) else {
        return Err(vec!["no <svg> element with a viewBox \"0 0 W H\"".into()]);
    };
    let texts = elements(svg, "text");
    let mut titles = 0;
    let mut labels: BTreeMap<String, usize> = BTreeMap::new();
    let mut axis_titles: BTreeMap<String, usize> = BTreeMap::new();
    for t in &texts {
        let class = t.attrs.get("class").map(String::as_str).unwrap_or("");
        let axis = t.attrs.get("data-axis").cloned().unwrap_or_default();
        let blank = t.content.trim().is_empty();
        match class {
            "title" if !blank => titles += 1,
            "tick-label" if !blank => *labels.entry(axis).or_default() += 1,
            "axis-title" if !blank => *axis_titles.entry(axis).or_default() += 1,
            _ => {}
        }
        match text_box(t, default_size) {
            Some((x0, y0, x1, y1)) => {
                let eps = 0.5;
                if x0 < -eps || y0 < -eps || x1 > width + eps || y1 > height + eps {
                    problems.push(format!(
                        "text {:?} ({class}) lies at x {x0:.1}..{x1:.1}, y {y0:.1}..{y1:.1}, \
                         outside the {width} x {height} document",
                        t.content
                    ));
                }
            }
            None => problems.push(format!("text {:?}: no position read", t.content)),
        }
    }
    let mut marks: BTreeMap<String, usize> = BTreeMap::new();
    for line in elements(svg, "line") {
        if line.attrs.get("class").map(String::as_str) == Some("tick") {
            let axis = line.attrs.get("data-axis").cloned().unwrap_or_default();
            *marks.entry(axis).or_default() += 1;
        }
    }
    if titles == 0 {
        problems.push("the chart has no title".into());
    }
    let mut names: Vec<&String> = marks
        .keys()
        .chain(labels.keys())
        .chain(axis_titles.keys())
        .collect();
    names.sort();
    names.dedup();
    if names.len() < 2 {
        problems.push(format!(
            "the chart has {} axes, a chart has at least two",
            names.len()
        ));
    }
    for name in &names {
        let (m, l, t) = (
            marks.get(*name).copied().unwrap_or(0),
            labels.get(*name).copied().unwrap_or(0),
            axis_titles.get(*name).copied().unwrap_or(0),
        );
        if m < 2 || l < 2 {
            problems.push(format!(
                "axis {name:?} has {m} tick marks and {l} labels (2 needed)"
            ));
        }
        if t != 1 {
            problems.push(format!("axis {name:?} has {t} titles (1 needed)"));
        }
    }
    if problems.is_empty() {
        Ok(Checked {
            width,
            height,
            texts: texts.len(),
            axes: labels,
        })
    } else {
        Err(problems)
    }
}

/// The root's viewBox size and default font size.
fn root(svg: &str) -> Option<(f64, f64, f64)> {
    let svg_el = elements(svg, "svg").into_iter().next()?;
    let vb: Vec<f64> = svg_el
        .attrs
        .get("viewBox")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let size = svg_el
        .attrs
        .get("font-size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(16.0);
    match vb[..] {
        [0.0, 0.0, w, h] if w > 0.0 && h > 0.0 => Some((w, h, size)),
        _ => None,
    }
}

/// The estimated box (x0, y0, x1, y1) of a text element.
fn text_box(t: &Text, default_size: f64) -> Option<(f64, f64, f64, f64)> {
    let num = |k: &str| t.attrs.get(k).and_then(|v| v.parse::<f64>().ok());
    let size = num("font-size").unwrap_or(default_size);
    let w = text_width(&unescape(&t.content), size);
    let anchor = t
        .attrs
        .get("text-anchor")
        .map(String::as_str)
        .unwrap_or("start");
    let along = |at: f64| match anchor {
        "middle" => (at - w / 2.0, at + w / 2.0),
        "end" => (at - w, at),
        _ => (at, at + w),
    };
    if let Some(tr) = t.attrs.get("transform") {
        // translate(X Y) rotate(-90): the text runs upwards from (X, Y).
        let inner = tr.strip_prefix("translate(")?;
        let (xy, rest) = inner.split_once(')')?;
        if rest.trim() != "rotate(-90)" {
            return None;
        }
        let mut it = xy.split([' ', ',']).filter(|s| !s.is_empty());
        let x: f64 = it.next()?.parse().ok()?;
        let y: f64 = it.next()?.parse().ok()?;
        let (a0, a1) = along(0.0);
        return Some((x - size * ASCENT_EM, y - a1, x + size * DESCENT_EM, y - a0));
    }
    let (x, y) = (num("x")?, num("y")?);
    let (x0, x1) = along(x);
    Some((x0, y - size * ASCENT_EM, x1, y + size * DESCENT_EM))
}

/// Every `<NAME ...>` element's attributes, with the text up to `</NAME>` for elements that
/// are not self-closing.
fn elements(svg: &str, name: &str) -> Vec<Text> {
    let open = format!("<{name} ");
    let close = format!("</{name}>");
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(end) = rest.find('>') else { break };
        let head = &rest[..end];
        let self_closing = head.ends_with('/');
        let attrs = attributes(head.trim_end_matches('/'));
        rest = &rest[end + 1..];
        let content = if self_closing {
            String::new()
        } else {
            let stop = rest.find(&close).unwrap_or(rest.len());
            let c = rest[..stop].to_string();
            rest = &rest[stop..];
            c
        };
        out.push(Text { attrs, content });
    }
    out
}

/// `k="v"` pairs of a start tag.
fn attributes(head: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = head;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim().to_string();
        let after = &rest[eq + 2..];
        let Some(q) = after.find('"') else { break };
        out.insert(key, unescape(&after[..q]));
        rest = &after[q + 1..];
    }
    out
}

/// Undoes [`crate::escape`].
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axes::{margins, Axis, Frame};
    use crate::text::Title;

    fn chart(title: &str, width: f64) -> String {
        let t = Title::fit(title, width);
        let x = Axis::numeric((0.0, 60.0), "time (s)");
        let y = Axis::numeric((0.0, 250.0), "requests/s");
        let (left, below) = margins(&y);
        let f = Frame {
            left,
            top: t.bottom() + 10.0,
            width: width - left - 20.0,
            height: 150.0,
        };
        let mut s = crate::document(width, f.bottom() + below, &t);
        f.draw_axes(&mut s, &x, &y, "c", false);
        s.push_str("</svg>\n");
        s
    }

    #[test]
    fn a_chart_drawn_by_the_crate_passes() {
        let long = "pagoda bench serve: http://127.0.0.1:41234 (smollm2:135m), \
                    sharegpt prompts from a file with a long name (500), Poisson at 8 req/s";
        for (title, w) in [("Short", 400.0), (long, 900.0), (long, 300.0)] {
            let svg = chart(title, w);
            let c = check(&svg).unwrap_or_else(|p| panic!("{p:#?}\n{svg}"));
            assert_eq!(c.axes.len(), 2);
            assert!(c.axes.values().all(|n| *n >= 2));
        }
    }

    #[test]
    fn a_clipped_title_is_found() {
        // The old layout: one line at 15 px centred, whatever its length.
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 300 100\" font-size=\"12\">\
                   <text class=\"title\" x=\"150\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">\
                   a title far too long to fit in three hundred units of width</text></svg>";
        let p = check(svg).unwrap_err();
        assert!(
            p.iter()
                .any(|p| p.contains("outside the 300 x 100 document")),
            "{p:?}"
        );
        assert!(p.iter().any(|p| p.contains("axes")), "{p:?}");
    }

    #[test]
    fn an_axis_without_ticks_or_title_is_found() {
        let good = chart("t", 400.0);
        // Drop the x axis's labels and its title.
        let bad: String = good
            .lines()
            .filter(|l| !l.contains("data-axis=\"c-x\""))
            .collect::<Vec<_>>()
            .join("\n");
        let y_only = check(&bad).unwrap_err();
        assert!(y_only.iter().any(|p| p.contains("axes")), "{y_only:?}");
        let untitled = good.replace("class=\"axis-title\" data-axis=\"c-y\"", "class=\"x\"");
        let p = check(&untitled).unwrap_err();
        assert!(
            p.iter().any(|p| p.contains("\"c-y\" has 0 titles")),
            "{p:?}"
        );
        let one_tick = good.replacen("class=\"tick-label\" data-axis=\"c-x\"", "class=\"x\"", 100);
        let p = check(&one_tick).unwrap_err();
        assert!(p.iter().any(|p| p.contains("\"c-x\" has")), "{p:?}");
        assert!(check(&good.replace("class=\"title\"", "class=\"x\"")).is_err());
    }

    #[test]
    fn rotated_and_escaped_text_is_measured_and_garbage_is_refused() {
        let svg = "<svg viewBox=\"0 0 100 100\" font-size=\"10\">\
                   <text transform=\"translate(5 50) rotate(-90)\" text-anchor=\"middle\">&lt;&gt;</text></svg>";
        let t = &elements(svg, "text")[0];
        let (x0, y0, x1, y1) = text_box(t, 10.0).unwrap();
        assert!((y1 - y0 - text_width("<>", 10.0)).abs() < 1e-9 && x0 < 5.0 && x1 > 5.0);
        assert!(check("").is_err());
        assert!(check("<svg viewBox=\"0 0 x y\"><text x=\"1\">").is_err());
        assert!(
            check("<svg viewBox=\"0 0 10 10\"><text class=\"title\" x=\"a\" y=\"1\">t</text>")
                .is_err()
        );
    }
}
