//! Progress bars for the long steps of a pull (download, copy, reassembly, hashing).
//!
//! Owns the bar styles. Invariant: bars draw on stderr only (stdout carries results), and draw
//! nothing when progress is off or stderr is not a terminal.

use std::io::{self, Read, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-counting bar with bytes/total/speed/eta, or a spinner when the total is unknown.
pub fn bytes_bar(enabled: bool, total: Option<u64>, message: impl Into<String>) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => {
            let bar = ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{msg} {bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
            }
            bar
        }
        None => {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {msg} {bytes} {binary_bytes_per_sec}")
            {
                bar.set_style(style);
            }
            bar
        }
    };
    bar.set_message(message.into());
    bar
}

/// Copies `reader` into `writer`, advancing `bar`; returns the bytes copied.
pub fn copy_with_progress(
    reader: &mut impl Read,
    writer: &mut impl Write,
    bar: &ProgressBar,
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
        bar.inc(n as u64);
    }
    Ok(total)
}
