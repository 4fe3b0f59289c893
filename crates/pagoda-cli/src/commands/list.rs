//! `pagoda list` (alias `ls`): the store as a table, like `ollama list`.
//!
//! Owns the table layout: NAME, ID (first 12 hex digits of the model file's sha256), SIZE
//! (decimal units), MODIFIED (relative time); with `--all`, a row per kept version (ID: the
//! version's digest, `*` marking the current one; CURRENT: when it was the current one).

use std::time::SystemTime;

use super::{human_size, open_store};
use crate::cli::ListArgs;
use pagoda_store::versions::short_id;

/// Runs `pagoda list` (`--all`: every kept version).
pub fn run(args: ListArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let now = SystemTime::now();
    if args.all {
        let rows: Vec<Vec<String>> = store
            .list_versions()?
            .iter()
            .map(|v| {
                let when = match v.until {
                    None => format!("current, since {}", relative_time(now, v.since)),
                    Some(until) => format!(
                        "{} until {}",
                        relative_time(now, v.since),
                        relative_time(now, until)
                    ),
                };
                vec![
                    v.name.clone(),
                    format!("{} {}", if v.current { "*" } else { " " }, short_id(&v.id)),
                    human_size(v.size),
                    when,
                ]
            })
            .collect();
        print_table(&["NAME", "  ID", "SIZE", "CURRENT"], &rows);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = store
        .list()?
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.digest.short().to_string(),
                human_size(m.size),
                relative_time(now, m.modified),
            ]
        })
        .collect();
    print_table(&["NAME", "ID", "SIZE", "MODIFIED"], &rows);
    Ok(())
}

/// Prints `header` and `rows` as left-aligned columns four spaces apart.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("    ").trim_end());
    }
}

/// "2 minutes ago", the way Ollama says it.
pub fn relative_time(now: SystemTime, then: SystemTime) -> String {
    let secs = now.duration_since(then).map(|d| d.as_secs()).unwrap_or(0);
    let plural = |n: u64, unit: &str| format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" });
    match secs {
        0 => "Less than a second ago".into(),
        1..=59 => plural(secs, "second"),
        60..=119 => "About a minute ago".into(),
        120..=3599 => plural(secs / 60, "minute"),
        3600..=7199 => "About an hour ago".into(),
        7200..=172_799 => plural(secs / 3600, "hour"),
        172_800..=1_209_599 => plural(secs / 86_400, "day"),
        1_209_600..=5_183_999 => plural(secs / 604_800, "week"),
        5_184_000..=63_071_999 => plural(secs / 2_592_000, "month"),
        _ => plural(secs / 31_536_000, "year"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn relative_times() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let ago = |s| relative_time(now, now - Duration::from_secs(s));
        assert_eq!(ago(0), "Less than a second ago");
        assert_eq!(ago(1), "1 second ago");
        assert_eq!(ago(90), "About a minute ago");
        assert_eq!(ago(600), "10 minutes ago");
        assert_eq!(ago(3 * 86_400), "3 days ago");
        assert_eq!(ago(3 * 604_800), "3 weeks ago");
        // A clock that went backwards is not an error.
        assert_eq!(
            relative_time(now, now + Duration::from_secs(5)),
            "Less than a second ago"
        );
    }
}
