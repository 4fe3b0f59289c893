//! Which URLs a pull may fetch: [`parse_http_url`] (the one parse of a URL's text),
//! [`check_hop`] (what every request of a download, redirects included, must pass), and
//! [`AllowList`] (the operator's `scheme://host[:port]` entries, `--pull-allow-source`).
//!
//! Invariants:
//! - every decision is made on a `url::Url`, the parser (WHATWG rules) ureq connects with, and
//!   the fetcher is handed that same `Url`: no check reads a URL's text with its own splitting,
//!   so `\`, `@`, percent-encoding, tabs or a missing `//` cannot make the check and the
//!   connection see different hosts;
//! - only `http` and `https` are fetched, at every hop (`file:` and any other scheme is an
//!   error, never followed);
//! - a URL carrying credentials (`user:password@host`) is refused, given or redirected to:
//!   a credential chosen by whoever wrote the URL is never sent, and no host is hidden
//!   behind one.

pub use url::{Host, Url};

/// Redirects one download follows before it gives up.
pub const MAX_REDIRECTS: usize = 10;

/// Parses `text` as an `http(s)` URL and checks its shape ([`check_hop`] without an allow
/// list). Control characters (tab, newline) are refused rather than silently dropped.
pub fn parse_http_url(text: &str) -> Result<Url, String> {
    let text = text.trim();
    if text.chars().any(|c| c.is_control()) {
        return Err("the URL holds control characters (tab, newline, ...)".into());
    }
    let url = Url::parse(text).map_err(|e| format!("not a valid URL ({e})"))?;
    check_hop(&url, None)?;
    Ok(url)
}

/// Whether a download may request `url`: an `http(s)` scheme, a host, no credentials, and —
/// where the pull is held to one — a host the allow list names. (Whether the host's
/// addresses are public is checked when connecting; see [`super::address`].)
pub fn check_hop(url: &Url, allow: Option<&AllowList>) -> Result<(), String> {
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(format!(
                "the scheme `{other}:` is not fetched (only http and https)"
            ))
        }
    }
    if url.host().is_none() {
        return Err("the URL has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "credentials in a URL (user:password@host) are refused; use a URL without them".into(),
        );
    }
    if let Some(list) = allow {
        if !list.allows(url) {
            return Err(format!(
                "{} is not a source this server allows",
                origin_text(url)
            ));
        }
    }
    Ok(())
}

/// `scheme://host:port` of `url`, for messages (never its path or query).
pub fn origin_text(url: &Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => format!("{}:", url.scheme()),
    }
}

/// Whether `a` and `b` have the same scheme, host and port (where a bearer token may go).
pub fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host() == b.host()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The operator's list of locations clients may pull from: `https://HOST`,
/// `https://HOST:PORT`, `https://*.DOMAIN` (its subdomains), `s3://BUCKET`, `gs://BUCKET`,
/// `az://CONTAINER`. An entry without a port allows the scheme's default port only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    origins: Vec<Origin>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(Host<String>),
    /// Any host ending in `.` + this lowercase domain.
    Subdomains(String),
}

/// The schemes an allow-list entry may name.
const ENTRY_SCHEMES: [&str; 6] = ["http", "https", "s3", "gs", "az", "azure"];

impl AllowList {
    /// Parses the URL entries of `--pull-allow-source` (the caller drops `hf` and `pip`);
    /// `Err` names the first entry that is not `scheme://host[:port]`.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<AllowList, String> {
        let origins = entries
            .into_iter()
            .map(|e| parse_entry(e).map_err(|why| format!("{e:?}: {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AllowList { origins })
    }

    /// Whether `url`'s scheme, host and port match an entry.
    pub fn allows(&self, url: &Url) -> bool {
        let Some(host) = url.host().map(|h| lower(h.to_owned())) else {
            return false;
        };
        self.origins.iter().any(|o| {
            o.scheme == url.scheme()
                && o.port.or_else(|| default_port(&o.scheme)) == url.port_or_known_default()
                && match &o.host {
                    HostPattern::Exact(h) => *h == host,
                    HostPattern::Subdomains(domain) => match &host {
                        Host::Domain(d) => d
                            .strip_suffix(domain.as_str())
                            .is_some_and(|sub| !sub.is_empty()),
                        _ => false,
                    },
                }
        })
    }
}

fn parse_entry(entry: &str) -> Result<Origin, String> {
    const SHAPE: &str =
        "expected scheme://HOST[:PORT] (https://*.DOMAIN for subdomains, s3://BUCKET for a bucket)";
    let entry = entry.trim();
    let (scheme, rest) = entry.split_once("://").ok_or(SHAPE)?;
    let (wildcard, rest) = match rest.strip_prefix("*.") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let url = parse_any(&format!("{scheme}://{rest}")).map_err(|e| format!("{e}; {SHAPE}"))?;
    if !ENTRY_SCHEMES.contains(&url.scheme()) {
        return Err(format!(
            "the scheme must be one of {}",
            ENTRY_SCHEMES.join(", ")
        ));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || !(url.path().is_empty() || url.path() == "/")
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(format!("only a scheme, a host and a port; {SHAPE}"));
    }
    let host = lower(url.host().ok_or(SHAPE)?.to_owned());
    let host = match (wildcard, host) {
        (false, h) => HostPattern::Exact(h),
        (true, Host::Domain(d)) => HostPattern::Subdomains(format!(".{d}")),
        (true, _) => return Err("`*.` goes before a domain name, not an address".into()),
    };
    Ok(Origin {
        scheme: url.scheme().to_string(),
        host,
        port: url.port(),
    })
}

/// Parses any URL text, control characters refused (the parser would drop them).
fn parse_any(text: &str) -> Result<Url, String> {
    if text.chars().any(|c| c.is_control()) {
        return Err("control characters (tab, newline, ...)".into());
    }
    Url::parse(text).map_err(|e| format!("not a valid URL ({e})"))
}

/// Object-store schemes keep a host's case (their hosts are opaque); buckets match in any case.
fn lower(host: Host<String>) -> Host<String> {
    match host {
        Host::Domain(d) => Host::Domain(d.to_ascii_lowercase()),
        other => other,
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// Parses an object-store URL (`s3://bucket/key`) the way the object_store crate reads its
/// bucket (`Url::host_str`), refusing credentials, ports, queries and fragments.
pub fn parse_object_url(text: &str) -> Result<Url, String> {
    let url = parse_any(text.trim())?;
    if !url.username().is_empty()
        || url.password().is_some()
        || url.port().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(
            "expected scheme://bucket/key, without credentials, port, query or fragment".into(),
        );
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL names no bucket".into());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().copied()).expect("allow list")
    }

    /// The host the fetcher would connect to, or why the URL is refused.
    fn decide(list: &AllowList, text: &str) -> Result<String, String> {
        let url = parse_http_url(text)?;
        check_hop(&url, Some(list))?;
        Ok(url.host_str().unwrap_or_default().to_string())
    }

    #[test]
    fn parser_differentials_are_decided_on_the_parsed_host() {
        let l = list(&["https://example.com"]);
        for refused in [
            // WHATWG reads `\` as `/`: the host is 127.0.0.1, not example.com.
            "https://127.0.0.1:9\\@example.com/x.gguf",
            "https://127.0.0.1\\@example.com/x.gguf",
            "https://evil.io\\.example.com/x.gguf",
            // Userinfo tricks: refused outright, whichever side names the allowed host.
            "https://example.com@127.0.0.1/x.gguf",
            "https://example.com:443@evil.io/x.gguf",
            "https://user:pw@example.com/x.gguf",
            "https://evil.io#@example.com/x.gguf",
            "https://evil.io?@example.com/x.gguf",
            // Tab and newline inside: the parser would drop them.
            "https://exa\tmple.com/x.gguf",
            "https://evil.io\n.example.com/x.gguf",
            // Another port than the entry's (the default).
            "https://example.com:8443/x.gguf",
            "http://example.com/x.gguf",
            "https://[::1]/x.gguf",
            "https://example.com.evil.io/x.gguf",
            "file:///etc/passwd",
            "ftp://example.com/x.gguf",
        ] {
            assert!(decide(&l, refused).is_err(), "{refused:?}");
        }
        // What passes is what is connected to.
        for (allowed, host) in [
            ("https://example.com/x.gguf", "example.com"),
            ("HTTPS://EXAMPLE.com/x.gguf", "example.com"),
            ("hTtPs://example.com:443/x.gguf", "example.com"),
            ("https://%65xample.com/x.gguf", "example.com"),
            // A special scheme without `//` still names a host; the decision sees that host.
            ("https:/example.com/x.gguf", "example.com"),
            ("https:example.com/x.gguf", "example.com"),
        ] {
            assert_eq!(decide(&l, allowed).as_deref(), Ok(host), "{allowed:?}");
        }
        assert!(decide(&l, "https:/evil.io/x.gguf").is_err());
    }

    #[test]
    fn entries_name_scheme_host_and_port() {
        let l = list(&[
            "https://models.example.com",
            "https://*.cdn.example",
            "http://[::1]:8080/",
            "https://mirror.example:8443",
            "s3://Team-Models",
        ]);
        let yes = |t: &str| l.allows(&Url::parse(t).expect("url"));
        assert!(yes("https://MODELS.example.com/a.gguf"));
        assert!(yes("https://eu.cdn.example/a.gguf"));
        assert!(yes("https://a.b.cdn.example/a.gguf"));
        assert!(!yes("https://cdn.example/a.gguf"));
        assert!(!yes("https://evilcdn.example/a.gguf"));
        assert!(yes("http://[0:0::1]:8080/a.gguf"));
        assert!(!yes("http://[::1]/a.gguf"));
        assert!(yes("https://mirror.example:8443/a.gguf"));
        assert!(!yes("https://mirror.example/a.gguf"));
        assert!(yes("s3://team-models/q.gguf"));
        assert!(!yes("gs://team-models/q.gguf"));
        for bad in [
            "example.com",
            "https://",
            "https://user@example.com",
            "https://example.com/path",
            "https://*.127.0.0.1",
            "file:///etc",
            "ftp://example.com",
            "https://exa\tmple.com",
        ] {
            assert!(AllowList::new([bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_hop_is_http_with_a_host_and_no_credentials() {
        let base = Url::parse("https://models.example.com/a/x.gguf").expect("url");
        let hop = |loc: &str| {
            base.join(loc)
                .map_err(|e| e.to_string())
                .and_then(|u| check_hop(&u, None))
        };
        assert!(hop("/b/x.gguf").is_ok());
        assert!(hop("https://cdn.example/x.gguf").is_ok());
        let e = hop("file:///etc/passwd").expect_err("file refused");
        assert!(e.contains("`file:`"), "{e}");
        assert!(hop("gopher://x/").is_err());
        assert!(hop("https://u:p@cdn.example/x").is_err());
        let l = list(&["https://models.example.com"]);
        let e = check_hop(&base.join("https://evil.io/x").expect("join"), Some(&l))
            .expect_err("not allowed");
        assert!(e.contains("https://evil.io:443"), "{e}");
        assert!(check_hop(
            &base.join("//models.example.com/y").expect("join"),
            Some(&l)
        )
        .is_ok());
    }

    #[test]
    fn object_urls_name_their_bucket_as_object_store_reads_it() {
        let u = parse_object_url("s3://bucket/key/x.gguf").expect("url");
        assert_eq!(u.host_str(), Some("bucket"));
        for bad in [
            "s3://user@bucket/x.gguf",
            "s3://bucket\\@other/x.gguf",
            "s3://bucket:9000/x.gguf",
            "s3://bucket/x.gguf?versionId=1",
            "s3:///x.gguf",
        ] {
            assert!(parse_object_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn same_origin_needs_scheme_host_and_port() {
        let hf = Url::parse("https://huggingface.co").expect("url");
        assert!(same_origin(
            &hf,
            &Url::parse("https://HuggingFace.co:443/a").expect("url")
        ));
        assert!(!same_origin(
            &hf,
            &Url::parse("http://huggingface.co/a").expect("url")
        ));
        assert!(!same_origin(
            &hf,
            &Url::parse("https://cdn-lfs.huggingface.co/a").expect("url")
        ));
        assert!(!same_origin(
            &hf,
            &Url::parse("https://huggingface.co:8443/a").expect("url")
        ));
    }
}
