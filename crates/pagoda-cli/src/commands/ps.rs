//! `pagoda ps`: the models a running `pagoda serve` has loaded, like `ollama ps`.
//!
//! Owns finding the server (`--host` / `--port`, or `PAGODA_HOST` written as `OLLAMA_HOST` is:
//! `host`, `host:port`, `http://host:port`, `https://host`), the `GET /api/ps` call and the
//! table: NAME, ID (first 12 hex digits of the loaded version's digest), SIZE (weights + KV
//! pool, decimal units), UNTIL (when an idle model unloads). Invariant: with no server
//! answering, the command fails (exit 1) saying how to start or point at one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use pagoda_server::DEFAULT_PORT;
use serde::Deserialize;

use super::human_size;
use super::list::relative_time;
use crate::cli::PsArgs;

/// `GET /api/ps`, read leniently: only what the table shows, every field optional, so any
/// Ollama-compatible server's answer reads.
#[derive(Debug, Default, Deserialize)]
struct PsResponse {
    #[serde(default)]
    models: Vec<RunningModel>,
}

#[derive(Debug, Default, Deserialize)]
struct RunningModel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    digest: String,
    /// RFC 3339.
    #[serde(default)]
    expires_at: String,
}

/// Runs `pagoda ps`.
pub fn run(args: PsArgs) -> anyhow::Result<()> {
    let base = server_url(args.host.as_deref(), args.port)?;
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let response = match agent.get(&format!("{base}/api/ps")).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            let body = r.into_string().unwrap_or_default();
            bail!(
                "the server at {base} answered GET /api/ps with HTTP {code}: {}",
                body.trim()
            )
        }
        Err(ureq::Error::Transport(t)) => bail!(
            "no Pagoda server answers at {base} ({t}); start one with `pagoda serve`, or point --host/--port (or PAGODA_HOST) at the one that runs"
        ),
    };
    let ps: PsResponse = response.into_json().with_context(|| {
        format!("{base}/api/ps did not answer with a list of loaded models; is it a Pagoda (or Ollama) server?")
    })?;
    print!("{}", render(&ps, SystemTime::now()));
    Ok(())
}

/// The server's base URL (`http://host:port`, no trailing slash) from `--host` or
/// `PAGODA_HOST` and `--port`; `0.0.0.0` (where a server listens) is reached on 127.0.0.1.
pub fn server_url(host: Option<&str>, port: Option<u16>) -> anyhow::Result<String> {
    let text = host
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .unwrap_or("127.0.0.1");
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => ("http".to_string(), text),
    };
    if scheme != "http" && scheme != "https" {
        bail!("host `{text}`: use host, host:port, http://host:port or https://host:port");
    }
    let authority = rest.split('/').next().unwrap_or("");
    let (h, p) = split_host_port(authority)
        .with_context(|| format!("host `{text}`: use host, host:port or http://host:port"))?;
    let h = match h {
        "" | "0.0.0.0" => "127.0.0.1",
        "[::]" => "[::1]",
        other => other,
    };
    let default = if scheme == "https" { 443 } else { DEFAULT_PORT };
    Ok(format!("{scheme}://{h}:{}", port.or(p).unwrap_or(default)))
}

fn split_host_port(s: &str) -> anyhow::Result<(&str, Option<u16>)> {
    let parse_port = |p: &str| -> anyhow::Result<u16> {
        p.parse()
            .with_context(|| format!("`{p}` is not a port number"))
    };
    if s.starts_with('[') {
        let Some(end) = s.find(']') else {
            bail!("an IPv6 address needs its closing ']'");
        };
        let (host, rest) = s.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(p) => Ok((host, Some(parse_port(p)?))),
            None if rest.is_empty() => Ok((host, None)),
            None => bail!("unexpected `{rest}` after the address"),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Ok((h, Some(parse_port(p)?))),
        None => Ok((s, None)),
    }
}

/// The table, header first, columns as `ollama ps` has them.
fn render(ps: &PsResponse, now: SystemTime) -> String {
    let rows: Vec<[String; 4]> = ps
        .models
        .iter()
        .map(|m| {
            let hex = m.digest.trim_start_matches("sha256:");
            let name = if m.name.is_empty() { &m.model } else { &m.name };
            [
                name.clone(),
                hex.get(..12).unwrap_or(hex).to_string(),
                human_size(m.size),
                until(&m.expires_at, now),
            ]
        })
        .collect();
    let header = ["NAME", "ID", "SIZE", "UNTIL"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$}    {:<w1$}    {:<w2$}    {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// "4 minutes from now"; "Forever" for a model that stays (the zero time `0001-01-01`, or
/// more than a century away); "Stopping..." once the time has passed.
fn until(expires_at: &str, now: SystemTime) -> String {
    const CENTURY: i64 = 100 * 365 * 86_400;
    let Some(at) = parse_rfc3339(expires_at) else {
        return expires_at.to_string();
    };
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if at < 0 || at - now > CENTURY {
        return "Forever".into();
    }
    if at <= now {
        return "Stopping...".into();
    }
    let secs = |s: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(s).unwrap_or(0));
    let text = relative_time(secs(at), secs(now));
    match text.strip_suffix(" ago") {
        Some(t) => format!("{t} from now"),
        None => text,
    }
}

/// Seconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let num = |a: usize, b: usize| -> Option<i64> {
        let t = s.get(a..b)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let sep = |i: usize, allowed: &[u8]| s.as_bytes().get(i).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = frac.get(digits..)?;
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes().get(3) != Some(&b':') {
                return None;
            }
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's method).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_as_ollama_reads_ollama_host() {
        let url = |h: Option<&str>, p: Option<u16>| server_url(h, p).unwrap();
        assert_eq!(url(None, None), "http://127.0.0.1:11435");
        assert_eq!(url(Some("example.com"), None), "http://example.com:11435");
        assert_eq!(
            url(Some("example.com:8000"), None),
            "http://example.com:8000"
        );
        assert_eq!(
            url(Some("example.com:8000"), Some(9)),
            "http://example.com:9"
        );
        assert_eq!(url(Some("0.0.0.0:11435"), None), "http://127.0.0.1:11435");
        assert_eq!(url(Some(":8000"), None), "http://127.0.0.1:8000");
        assert_eq!(url(Some("https://h.io/"), None), "https://h.io:443");
        assert_eq!(url(Some("http://[::1]:7/x"), None), "http://[::1]:7");
        assert_eq!(url(Some("[::]"), None), "http://[::1]:11435");
        assert!(server_url(Some("ftp://x"), None).is_err());
        assert!(server_url(Some("x:port"), None).is_err());
        assert!(server_url(Some("[::1"), None).is_err());
    }

    #[test]
    fn answers_read_leniently() {
        let full = r#"{"models":[{"name":"a:1","model":"a:1","size":5,"digest":"abc",
            "details":{"parent_model":"","format":"gguf","family":"llama","families":null,
            "parameter_size":"1M","quantization_level":"Q4_1"},
            "expires_at":"2026-12-03T00:04:00.5Z","size_vram":0}]}"#;
        let ps: PsResponse = serde_json::from_str(full).unwrap();
        assert_eq!(ps.models[0].name, "a:1");
        assert_eq!(ps.models[0].size, 5);
        let ps: PsResponse = serde_json::from_str(r#"{"models":[{"model":"b"}]}"#).unwrap();
        assert!(render(&ps, UNIX_EPOCH)
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with('b')));
        let ps: PsResponse = serde_json::from_str("{}").unwrap();
        assert!(ps.models.is_empty());
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2000-02-29T12:34:56.500000000Z"),
            Some(951_827_696)
        );
        assert_eq!(
            parse_rfc3339("2026-12-03T01:00:00+01:00"),
            Some(1_796_256_000)
        );
        assert!(parse_rfc3339("0001-01-01T00:00:00Z").is_some_and(|t| t < 0));
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-03T00:00:00",
            "2026-12-03T00:00:00+0100",
            "２０２６-12-03T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn table_like_ollama_ps() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_256_000);
        let model = |name: &str, expires: &str| RunningModel {
            name: name.into(),
            model: name.into(),
            size: 98_362_432,
            digest: format!("sha256:{}", "ab".repeat(32)),
            expires_at: expires.into(),
        };
        let ps = PsResponse {
            models: vec![
                model("smollm2:135m", "2026-12-03T00:04:00Z"),
                model("pirate:latest", "0001-01-01T00:00:00Z"),
                model("old:1", "2026-12-02T23:00:00Z"),
            ],
        };
        let out = render(&ps, now);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "NAME             ID              SIZE     UNTIL");
        assert_eq!(
            lines[1],
            "smollm2:135m     abababababab    98 MB    4 minutes from now"
        );
        assert!(lines[2].ends_with("Forever"), "{out}");
        assert!(lines[3].ends_with("Stopping..."), "{out}");
        assert_eq!(
            render(&PsResponse::default(), now),
            "NAME    ID    SIZE    UNTIL\n"
        );
    }
}
