//! What a long command (`eval report`, `eval perplexity`, `quantize`, `prune`, `distill`,
//! `compress`, `batch`, `merge-lora`) shows while it works: one indicatif bar on a terminal,
//! and otherwise (a log, CI, a pipe) plain lines such as `quantize: layers 12/32` — the same
//! choice a pull makes ([`pagoda_store::progress::ProgressDisplay::for_stderr`]).
//!
//! The library crates report progress through their callbacks (`|done, total|`); a command
//! hands each callback a [`Progress`] and knows nothing of terminals.
//!
//! Invariants: output goes to stderr only (stdout carries results); without a terminal no
//! control characters are written and a count of at most [`EVERY_STEP`] stages gets a line
//! per stage, a longer count (windows, questions, requests, tensors) a line at most every
//! [`LINE_INTERVAL`] and one at the end; the position never moves back and never passes the
//! length.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pagoda_store::progress::ProgressDisplay;

/// Counts up to this many get a line per step when stderr is not a terminal.
pub const EVERY_STEP: u64 = 64;

/// Longer counts get a line at most this often (and when done).
pub const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// The bar on a terminal: what, the bar, done/total, elapsed and ETA, a message.
const BAR_TEMPLATE: &str = "{prefix} {bar:30.cyan/blue} {pos}/{len} {msg} [{elapsed} < {eta}]";

/// Where plain lines go (stderr, or a test's buffer).
type LineSink = Box<dyn Fn(&str) + Send + Sync>;

/// The plain lines' state.
struct Lines {
    pos: u64,
    msg: String,
    /// The position of the last line printed (`None`: none yet).
    printed: Option<u64>,
    last: Instant,
}

/// One counted stage of a command (see the module doc).
pub struct Progress {
    /// `quantize: layers`: the command and what is counted.
    prefix: String,
    len: u64,
    bar: Option<ProgressBar>,
    lines: Option<(Mutex<Lines>, LineSink)>,
}

impl Progress {
    /// Progress of `command` over `len` `what`s (`layers`, `windows`), shown as a bar on a
    /// terminal and as lines otherwise.
    pub fn new(command: &str, what: &str, len: usize) -> Progress {
        Self::with_display(
            ProgressDisplay::for_stderr(true),
            command,
            what,
            len,
            Box::new(|l| eprintln!("{l}")),
        )
    }

    /// Like [`Progress::new`] with the display chosen and the lines going to `sink`.
    pub fn with_display(
        display: ProgressDisplay,
        command: &str,
        what: &str,
        len: usize,
        sink: LineSink,
    ) -> Progress {
        let prefix = format!("{command}: {what}");
        let len = len as u64;
        let (bar, lines) = match display {
            ProgressDisplay::Bar => {
                let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
                if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_prefix(prefix.clone());
                (Some(bar), None)
            }
            ProgressDisplay::Lines => {
                let state = Lines {
                    pos: 0,
                    msg: String::new(),
                    printed: None,
                    last: Instant::now(),
                };
                (None, Some((Mutex::new(state), sink)))
            }
            ProgressDisplay::Off => (None, None),
        };
        Progress {
            prefix,
            len,
            bar,
            lines,
        }
    }

    /// `done` of the length are finished (kept within 0..=len, never moving back).
    pub fn set(&self, done: usize) {
        let done = (done as u64).min(self.len);
        if let Some(bar) = &self.bar {
            if done > bar.position() {
                bar.set_position(done);
            }
        }
        if let Some((state, sink)) = &self.lines {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            if done > s.pos {
                s.pos = done;
                self.maybe_line(&mut s, sink, false);
            }
        }
    }

    /// One more is finished.
    pub fn inc(&self) {
        let pos = match (&self.bar, &self.lines) {
            (_, Some((state, _))) => state.lock().unwrap_or_else(PoisonError::into_inner).pos,
            (Some(bar), None) => bar.position(),
            (None, None) => return,
        };
        self.set(pos as usize + 1);
    }

    /// A note after the count (`3 right`, the measurement under way); shown on the bar at
    /// once, on the next line printed otherwise.
    pub fn message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        if let Some(bar) = &self.bar {
            bar.set_message(msg.clone());
        }
        if let Some((state, _)) = &self.lines {
            state.lock().unwrap_or_else(PoisonError::into_inner).msg = msg;
        }
    }

    /// A line of its own (a result along the way), printed above the bar on a terminal.
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// The stage is over: the bar is cleared; without a terminal the last position gets its
    /// line if it has none yet.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((state, sink)) = &self.lines {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            self.maybe_line(&mut s, sink, true);
        }
    }

    /// Prints the line of the position when it is due (see the module invariants).
    fn maybe_line(&self, s: &mut Lines, sink: &LineSink, finishing: bool) {
        if s.printed == Some(s.pos) || (finishing && s.pos == 0 && self.len > 0) {
            return;
        }
        let due = self.len <= EVERY_STEP
            || s.pos == self.len
            || finishing
            || s.last.elapsed() >= LINE_INTERVAL;
        if due {
            let msg = if s.msg.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.msg)
            };
            sink(&format!("{} {}/{}{msg}", self.prefix, s.pos, self.len));
            s.printed = Some(s.pos);
            s.last = Instant::now();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn lines(command: &str, what: &str, len: usize) -> (Progress, Arc<Mutex<Vec<String>>>) {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&out);
        let p = Progress::with_display(
            ProgressDisplay::Lines,
            command,
            what,
            len,
            Box::new(move |l| sink.lock().unwrap().push(l.to_string())),
        );
        (p, out)
    }

    #[test]
    fn a_few_stages_get_a_line_each_never_backwards() {
        let (p, out) = lines("quantize", "layers", 3);
        p.set(1);
        p.set(1);
        p.set(0);
        p.message("half");
        p.inc();
        p.set(9);
        p.finish();
        assert_eq!(
            *out.lock().unwrap(),
            [
                "quantize: layers 1/3",
                "quantize: layers 2/3 (half)",
                "quantize: layers 3/3 (half)"
            ]
        );
    }

    #[test]
    fn a_long_count_gets_the_first_lines_then_the_end_not_a_line_per_step() {
        let (p, out) = lines("eval perplexity", "windows", 10_000);
        for i in 1..=10_000 {
            p.set(i);
        }
        p.finish();
        let out = out.lock().unwrap();
        assert_eq!(out.last().unwrap(), "eval perplexity: windows 10000/10000");
        assert!(out.len() <= 2, "{out:?}");
    }

    #[test]
    fn an_unfinished_count_says_where_it_stopped_once_and_nothing_is_shown_when_off() {
        let (p, out) = lines("prune", "windows", 1000);
        p.set(10);
        p.finish();
        p.finish();
        assert_eq!(*out.lock().unwrap(), ["prune: windows 10/1000"]);
        let off = Progress::with_display(ProgressDisplay::Off, "x", "y", 3, Box::new(|_| panic!()));
        off.set(2);
        off.inc();
        off.finish();
    }
}
