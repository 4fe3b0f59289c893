//! Text sizes without a font: the width a label will take estimated from its character count
//! and font size, greedy word wrapping, and the chart title fitted to the width
//! ([`Title`]: wrapped onto lines, shrunk down to [`MIN_TITLE_SIZE`] before that).
//!
//! Invariants: the estimate errs wide ([`CHAR_WIDTH_EM`] is above the average advance of
//! common sans-serif fonts, DejaVu Sans' digits included), so text laid out by it fits when
//! a browser draws it; [`crate::check`] measures with the same functions.

use crate::escape;

/// Estimated advance of one character, in ems.
pub const CHAR_WIDTH_EM: f64 = 0.62;
/// Height above the baseline a line takes, in ems.
pub const ASCENT_EM: f64 = 0.9;
/// Depth below the baseline, in ems.
pub const DESCENT_EM: f64 = 0.25;
/// Baseline to baseline of wrapped lines, in ems.
pub const LINE_EM: f64 = 1.3;

/// A chart title's largest and smallest font sizes.
pub const TITLE_SIZE: f64 = 15.0;
pub const MIN_TITLE_SIZE: f64 = 11.0;
/// Space between the title and the document's edges.
pub const TITLE_PAD: f64 = 12.0;

/// The estimated width of `text` (as shown, not escaped) at `size`.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * CHAR_WIDTH_EM
}

/// `text` wrapped greedily at spaces into lines of at most `max_width` at `size`; a word
/// longer than a line is cut between characters. Never empty for a non-empty text.
pub fn wrap(text: &str, max_width: f64, size: f64) -> Vec<String> {
    let max_chars = ((max_width / (size * CHAR_WIDTH_EM)).floor() as usize).max(1);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > max_chars {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            lines.push(word.drain(..max_chars).collect());
        }
        let word: String = word.into_iter().collect();
        let need = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && need > max_chars {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// A chart title fitted to a document's width: one line at [`TITLE_SIZE`] when it fits,
/// else the largest size down to [`MIN_TITLE_SIZE`] that fits it on at most two lines,
/// else as many lines as it takes at the smallest size.
#[derive(Debug, Clone, PartialEq)]
pub struct Title {
    pub lines: Vec<String>,
    pub size: f64,
}

impl Title {
    /// `text` fitted to a document `width` wide.
    pub fn fit(text: &str, width: f64) -> Title {
        let room = (width - 2.0 * TITLE_PAD).max(TITLE_SIZE);
        let mut size = TITLE_SIZE;
        loop {
            let lines = wrap(text, room, size);
            let fits = lines.len() <= 1 || (lines.len() <= 2 && size < TITLE_SIZE);
            if fits || size <= MIN_TITLE_SIZE {
                return Title { lines, size };
            }
            size -= 1.0;
        }
    }

    /// From the document's top to below the title's last line: where a chart may begin.
    pub fn bottom(&self) -> f64 {
        TITLE_PAD + self.lines.len().max(1) as f64 * self.size * LINE_EM
    }

    /// The title's `<text class="title">` elements, one a line, centred in `width`.
    pub fn svg(&self, width: f64) -> String {
        let mut s = String::new();
        for (i, line) in self.lines.iter().enumerate() {
            let y = TITLE_PAD + self.size * ASCENT_EM + i as f64 * self.size * LINE_EM;
            s.push_str(&format!(
                "<text class=\"title\" x=\"{cx}\" y=\"{y:.1}\" text-anchor=\"middle\" \
                 font-size=\"{size}\">{t}</text>\n",
                cx = width / 2.0,
                size = self.size,
                t = escape(line),
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_every_word_and_every_line_fits() {
        let text = "pagoda bench serve: http://127.0.0.1:43211 (smollm2:135m), sharegpt \
                    prompts (200), Poisson arrivals at 4 req/s";
        let lines = wrap(text, 300.0, 12.0);
        assert!(lines.len() > 1);
        for l in &lines {
            assert!(text_width(l, 12.0) <= 300.0, "{l}");
        }
        assert_eq!(
            lines.join(" "),
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let long = wrap(
            "abcdefghijklmnopqrstuvwxyz",
            5.0 * 12.0 * CHAR_WIDTH_EM,
            12.0,
        );
        assert_eq!(long, ["abcde", "fghij", "klmno", "pqrst", "uvwxy", "z"]);
        assert!(wrap("", 100.0, 12.0).is_empty());
    }

    #[test]
    fn a_title_shrinks_then_wraps_to_fit_the_width() {
        let short = Title::fit("Size against perplexity", 720.0);
        assert_eq!((short.lines.len(), short.size), (1, TITLE_SIZE));
        let long = "x ".repeat(60);
        let t = Title::fit(&long, 400.0);
        assert!(t.size < TITLE_SIZE && t.lines.len() <= 2 || t.size == MIN_TITLE_SIZE);
        for l in &t.lines {
            assert!(text_width(l, t.size) <= 400.0 - 2.0 * TITLE_PAD, "{l}");
        }
        assert!(t.bottom() > TITLE_PAD + t.size);
        let svg = t.svg(400.0);
        assert_eq!(svg.matches("class=\"title\"").count(), t.lines.len());
    }
}
