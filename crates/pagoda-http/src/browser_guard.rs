//! Keeping web pages out of a local server: which `Origin` and `Host` a request may carry,
//! and the CORS headers an allowed origin gets.
//!
//! Why: a page on any site can send a "simple" cross-site request (`POST` with `text/plain`
//! or a form body: no preflight) to `http://127.0.0.1:PORT`, and a DNS-rebinding page
//! (`evil.example` re-pointed at 127.0.0.1) can even read the answers. Browsers always send
//! `Host`, and send `Origin` on every cross-origin request and on same-origin `POST`s, so:
//! - **Host**: on a loopback bind, only the server's own names are answered — `localhost`,
//!   loopback IP literals, the bind host — plus [`BrowserRules::allowed_hosts`]; any port.
//!   A rebinding page's requests carry its own name and are refused. On any other bind (a
//!   deliberate network deployment, reached by names and addresses the server cannot know)
//!   the check is off unless hosts are listed. A request with no Host at all (HTTP/1.0) is
//!   no browser's and passes.
//! - **Origin**: none passes (curl, SDKs). Otherwise allowed are: loopback pages
//!   (`http`/`https` on `localhost`, `127.x.x.x`, `[::1]`, any port), desktop-app schemes
//!   that no web page can claim (`app:`, `file:`, `tauri:`, `vscode-webview:`,
//!   `vscode-file:`, as Ollama allows), the server's own origin (the Origin names the
//!   request's Host, and that Host is vetted: it passed the Host check, or it is an IP
//!   literal, which no rebinding can produce), and [`BrowserRules::allowed_origins`]
//!   (`*` in an entry matches any run of characters; `*` alone allows all). `null` (sandboxed
//!   frames, which any site can make) only when listed.
//!
//! Invariants: the decision is made from the request head alone, before routing or keys, so
//! a refused request changes nothing; an allowed origin's response echoes that origin in
//! `Access-Control-Allow-Origin` (never `*` unless `*` is listed) with `Vary: Origin`.

use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, Uri};
use std::net::{IpAddr, SocketAddr};

/// Schemes of desktop apps (Electron, Tauri, VS Code webviews): no web page has them.
const APP_SCHEMES: &[&str] = &["app", "file", "tauri", "vscode-webview", "vscode-file"];
/// What a preflight may ask for: every method the servers route.
const ALLOW_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
/// How long a browser may cache a preflight's answer, seconds.
const PREFLIGHT_MAX_AGE: &str = "600";
/// Response headers a page may read (besides the CORS-safelisted ones).
const EXPOSE_HEADERS: &str = "x-request-id, retry-after";

/// The operator's widening of the defaults (`--allowed-origins`, `--allowed-hosts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrowserRules {
    /// Origins allowed besides the defaults: `scheme://host[:port]` with `*` wildcards,
    /// `null`, or `*` (all).
    pub allowed_origins: Vec<String>,
    /// Host names answered besides the defaults (`*.DOMAIN` for its subdomains, `*` for
    /// all); giving any turns the Host check on for a non-loopback bind too.
    pub allowed_hosts: Vec<String>,
}

impl BrowserRules {
    /// Whether every entry is usable (what [`BrowserGuard::new`] would refuse).
    pub fn validate(&self) -> Result<(), RuleError> {
        self.allowed_origins
            .iter()
            .try_for_each(|o| origin_rule(o).map(drop))?;
        self.allowed_hosts
            .iter()
            .try_for_each(|h| host_rule(h).map(drop))
    }
}

/// A rule that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("--allowed-origins {0:?}: expected an origin such as https://app.example or http://localhost:3000 (scheme://host[:port], no path; `*` wildcards), `null`, or `*`")]
    Origin(String),
    #[error("--allowed-hosts {0:?}: expected a host name or IP address without a port (app.example, *.example.com, 192.168.1.5, [fe80::1]), or `*`")]
    Host(String),
}

/// Why a request was refused (the server writes it as 403 in its error shape).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("requests from the web page at origin `{0}` are refused: a page could otherwise use this server without its user knowing. To allow that page, start the server with --allowed-origins {0} (or PAGODA_ORIGINS={0})")]
    Origin(String),
    #[error("Host `{0}` does not name this server, which listens on a loopback address: a page behind a DNS-rebinding name would send such a Host. Use localhost or 127.0.0.1, or start the server with --allowed-hosts {0}")]
    Host(String),
}

/// What a passing request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// No Origin: served as is.
    NoOrigin,
    /// An allowed origin: served, and [`Pass::decorate`] adds the CORS headers.
    Cors(HeaderValue),
    /// A preflight from an allowed origin: answered at once (204) with [`Pass::decorate`]'s
    /// headers, never routed.
    Preflight(HeaderValue),
}

/// The compiled rules of one bound server.
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    any_origin: bool,
    origins: Vec<String>,
    /// `None`: the Host check is off.
    hosts: Option<Vec<String>>,
}

impl BrowserGuard {
    /// The guard of a server bound to `bound` (its socket) as `bind_host` (the name it was
    /// given, e.g. `localhost`).
    pub fn new(
        rules: &BrowserRules,
        bind_host: &str,
        bound: SocketAddr,
    ) -> Result<BrowserGuard, RuleError> {
        let mut origins = Vec::new();
        for entry in &rules.allowed_origins {
            origins.push(origin_rule(entry)?);
        }
        let mut listed = Vec::new();
        for entry in &rules.allowed_hosts {
            listed.push(host_rule(entry)?);
        }
        let hosts = if bound.ip().is_loopback() || !listed.is_empty() {
            let bind = host_rule(bind_host).ok();
            Some(listed.into_iter().chain(bind).collect())
        } else {
            None
        };
        Ok(BrowserGuard {
            any_origin: origins.iter().any(|o| o == "*"),
            origins,
            hosts,
        })
    }

    /// Whether the Host check is on.
    pub fn checks_host(&self) -> bool {
        self.hosts.is_some()
    }

    /// The verdict on a request head.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<Pass, Refusal> {
        let host = headers
            .get(header::HOST)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase())
            .or_else(|| uri.authority().map(|a| a.as_str().to_ascii_lowercase()));
        if let (Some(host), Some(_)) = (&host, &self.hosts) {
            if !self.host_allowed(host) {
                return Err(Refusal::Host(host.clone()));
            }
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(Pass::NoOrigin);
        };
        let text = String::from_utf8_lossy(origin.as_bytes()).to_ascii_lowercase();
        if !self.origin_allowed(&text, host.as_deref()) {
            return Err(Refusal::Origin(text));
        }
        let allow = if self.any_origin {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        };
        if method == Method::OPTIONS && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            Ok(Pass::Preflight(allow))
        } else {
            Ok(Pass::Cors(allow))
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some((name, _port)) = split_host(host) else {
            return false;
        };
        is_loopback_name(name)
            || self
                .hosts
                .iter()
                .flatten()
                .any(|rule| host_matches(rule, name))
    }

    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any_origin || self.origins.iter().any(|rule| glob(rule, origin)) {
            return true;
        }
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        if APP_SCHEMES.contains(&scheme) {
            return true;
        }
        if !matches!(scheme, "http" | "https") {
            return false;
        }
        let Some((name, port)) = split_host(authority) else {
            return false;
        };
        if is_loopback_name(name) {
            return true;
        }
        // The server's own origin: the page was loaded from the Host it is calling.
        let default_port = if scheme == "http" { "80" } else { "443" };
        let same = host.and_then(split_host).is_some_and(|(h, p)| {
            h == name && p.unwrap_or(default_port) == port.unwrap_or(default_port)
        });
        same && (self.checks_host() || is_ip_literal(name))
    }
}

impl Pass {
    /// Adds the CORS headers for this verdict to a response's headers (none for
    /// [`Pass::NoOrigin`]); `request` is the request's headers (what a preflight asked for).
    pub fn decorate(&self, request: &HeaderMap, response: &mut HeaderMap) {
        let allow = match self {
            Pass::NoOrigin => return,
            Pass::Cors(allow) | Pass::Preflight(allow) => allow.clone(),
        };
        response.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        response.append(header::VARY, HeaderValue::from_static("Origin"));
        if let Pass::Preflight(_) = self {
            response.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_METHODS),
            );
            if let Some(asked) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
                response.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
            response.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(PREFLIGHT_MAX_AGE),
            );
            response.append(
                header::VARY,
                HeaderValue::from_static(
                    "Access-Control-Request-Method, Access-Control-Request-Headers",
                ),
            );
        } else {
            response.insert(
                HeaderName::from_static("access-control-expose-headers"),
                HeaderValue::from_static(EXPOSE_HEADERS),
            );
        }
    }
}

/// One `--allowed-origins` entry, lowercased.
fn origin_rule(entry: &str) -> Result<String, RuleError> {
    let rule = entry.trim().to_ascii_lowercase();
    if rule == "*" || rule == "null" {
        return Ok(rule);
    }
    let well_formed = rule.split_once("://").is_some_and(|(scheme, rest)| {
        !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.' | b'*'))
            && !rest.is_empty()
            && !rest.contains(['/', '?', '#', '@', ' ', ','])
    });
    if well_formed {
        Ok(rule)
    } else {
        Err(RuleError::Origin(entry.to_string()))
    }
}

/// One `--allowed-hosts` entry (or the bind host), lowercased, IPv6 in brackets.
fn host_rule(entry: &str) -> Result<String, RuleError> {
    let rule = entry.trim().to_ascii_lowercase();
    if rule == "*" {
        return Ok(rule);
    }
    if let Ok(IpAddr::V6(v6)) = rule.parse::<IpAddr>() {
        return Ok(format!("[{v6}]"));
    }
    let name = rule.strip_prefix("*.").unwrap_or(&rule);
    let ok = match split_host(&rule) {
        Some((h, None)) if h.starts_with('[') => matches!(ip_of(h), Some(IpAddr::V6(_))),
        Some((_, None)) => {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        }
        _ => false,
    };
    if ok {
        Ok(rule)
    } else {
        Err(RuleError::Host(entry.to_string()))
    }
}

/// `host[:port]` → (host, port); an IPv6 host keeps its brackets. `None` when malformed.
fn split_host(authority: &str) -> Option<(&str, Option<&str>)> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')? + 1;
        match &authority[end..] {
            "" => (&authority[..end], None),
            rest => (&authority[..end], Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (!host.is_empty() && port_ok).then_some((host, port))
}

/// `localhost`, `127.x.x.x`, `[::1]`.
fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || ip_of(host).is_some_and(|ip| ip.is_loopback())
}

fn is_ip_literal(host: &str) -> bool {
    ip_of(host).is_some()
}

fn ip_of(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

/// Whether host rule `rule` (`*`, `*.DOMAIN`, a name or address) admits `name`.
fn host_matches(rule: &str, name: &str) -> bool {
    match rule.strip_prefix("*.") {
        _ if rule == "*" => true,
        Some(domain) => name
            .strip_suffix(domain)
            .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        None => rule == name,
    }
}

/// Whether `pattern`, where `*` matches any run of characters, matches all of `text`.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(origins: &[&str], hosts: &[&str], bind: &str) -> BrowserGuard {
        let rules = BrowserRules {
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
        };
        let addr: SocketAddr = format!("{bind}:11435")
            .parse()
            .unwrap_or_else(|_| format!("[{bind}]:11435").parse().expect("address"));
        BrowserGuard::new(&rules, bind, addr).expect("rules")
    }

    fn head(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(header::HOST, host.parse().expect("header"));
        }
        if let Some(origin) = origin {
            h.insert(header::ORIGIN, origin.parse().expect("header"));
        }
        h
    }

    fn verdict(
        g: &BrowserGuard,
        host: Option<&str>,
        origin: Option<&str>,
    ) -> Result<Pass, Refusal> {
        g.check(
            &Method::POST,
            &Uri::from_static("/api/copy"),
            &head(host, origin),
        )
    }

    #[test]
    fn loopback_bind_answers_only_its_own_names() {
        let g = guard(&[], &[], "127.0.0.1");
        for ok in [
            "localhost",
            "localhost:11435",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:11435",
            "LOCALHOST:1",
        ] {
            assert_eq!(verdict(&g, Some(ok), None), Ok(Pass::NoOrigin), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:11435",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[::1",
            "a:b:c",
            "localhost:x",
        ] {
            assert_eq!(
                verdict(&g, Some(bad), None),
                Err(Refusal::Host(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            verdict(&g, None, None),
            Ok(Pass::NoOrigin),
            "no Host (HTTP/1.0)"
        );
        // The bind host's own name, and hosts the operator lists (with subdomains).
        let g = guard(&[], &["pagoda.lan", "*.corp.example"], "::1");
        for ok in [
            "pagoda.lan:80",
            "a.corp.example",
            "x.y.corp.example:1",
            "[::1]",
        ] {
            assert!(verdict(&g, Some(ok), None).is_ok(), "{ok}");
        }
        for bad in ["corp.example", "evilcorp.example", "pagoda.lan.evil"] {
            assert!(verdict(&g, Some(bad), None).is_err(), "{bad}");
        }
    }

    #[test]
    fn network_bind_checks_hosts_only_when_listed() {
        let g = guard(&[], &[], "0.0.0.0");
        assert!(!g.checks_host());
        assert_eq!(
            verdict(&g, Some("anything.example"), None),
            Ok(Pass::NoOrigin)
        );
        let g = guard(&[], &["pagoda.example"], "0.0.0.0");
        assert!(g.checks_host());
        assert!(verdict(&g, Some("pagoda.example:11435"), None).is_ok());
        assert!(verdict(&g, Some("localhost"), None).is_ok());
        assert!(verdict(&g, Some("other.example"), None).is_err());
        assert!(verdict(&guard(&[], &["*"], "127.0.0.1"), Some("x.example"), None).is_ok());
    }

    #[test]
    fn origins_default_to_loopback_apps_and_the_server_itself() {
        let g = guard(&[], &[], "127.0.0.1");
        let host = Some("127.0.0.1:11435");
        for ok in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
            "http://127.0.0.1:11435",
            "app://obsidian.md",
            "tauri://localhost",
            "file://",
        ] {
            let pass = verdict(&g, host, Some(ok));
            assert_eq!(
                pass,
                Ok(Pass::Cors(HeaderValue::from_str(ok).expect("value"))),
                "{ok}"
            );
        }
        for bad in [
            "https://evil.example",
            "http://localhost.evil.example",
            "null",
            "chrome-extension://abc",
            "http://127.0.0.1.evil.example",
            "evil",
        ] {
            assert_eq!(
                verdict(&g, host, Some(bad)),
                Err(Refusal::Origin(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn same_origin_counts_only_for_a_vetted_host() {
        // Network bind, no Host check: an IP literal cannot be rebound, a name can.
        let g = guard(&[], &[], "0.0.0.0");
        assert!(verdict(
            &g,
            Some("192.168.1.5:11435"),
            Some("http://192.168.1.5:11435")
        )
        .is_ok());
        assert!(verdict(
            &g,
            Some("evil.example:11435"),
            Some("http://evil.example:11435")
        )
        .is_err());
        assert!(verdict(
            &g,
            Some("192.168.1.5:11435"),
            Some("http://192.168.1.5:9999")
        )
        .is_err());
        // Listed hosts are vetted; default ports are implied.
        let g = guard(&[], &["pagoda.example"], "0.0.0.0");
        assert!(verdict(&g, Some("pagoda.example"), Some("https://pagoda.example")).is_ok());
        assert!(verdict(
            &g,
            Some("pagoda.example:443"),
            Some("https://pagoda.example")
        )
        .is_ok());
        assert!(verdict(&g, Some("pagoda.example"), Some("http://pagoda.example:81")).is_err());
    }

    #[test]
    fn listed_origins_widen_and_star_allows_all() {
        let g = guard(
            &["https://app.example", "http://*.dev.example:*", "null"],
            &[],
            "127.0.0.1",
        );
        for ok in [
            "https://app.example",
            "HTTPS://APP.EXAMPLE",
            "http://a.dev.example:5173",
            "null",
        ] {
            assert!(verdict(&g, None, Some(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "https://app.example:8443",
            "http://app.example",
            "http://dev.example:1",
            "https://evil.example",
        ] {
            assert!(verdict(&g, None, Some(bad)).is_err(), "{bad}");
        }
        let g = guard(&["*"], &[], "127.0.0.1");
        assert_eq!(
            verdict(&g, None, Some("https://evil.example")),
            Ok(Pass::Cors(HeaderValue::from_static("*")))
        );
    }

    #[test]
    fn bad_rules_are_refused_by_name() {
        let rules = |o: &str, h: &str| BrowserRules {
            allowed_origins: vec![o.into()]
                .into_iter()
                .filter(|s: &String| !s.is_empty())
                .collect(),
            allowed_hosts: vec![h.into()]
                .into_iter()
                .filter(|s: &String| !s.is_empty())
                .collect(),
        };
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        for bad in [
            "app.example",
            "https://app.example/path",
            "https://",
            "https://a b",
        ] {
            let e = BrowserGuard::new(&rules(bad, ""), "127.0.0.1", addr).unwrap_err();
            assert_eq!(e, RuleError::Origin(bad.into()));
        }
        for bad in ["pagoda.example:8080", "https://pagoda.example", "a/b", "*."] {
            let e = BrowserGuard::new(&rules("", bad), "127.0.0.1", addr).unwrap_err();
            assert_eq!(e, RuleError::Host(bad.into()));
        }
        assert!(BrowserGuard::new(&rules("", "fe80::1"), "127.0.0.1", addr).is_ok());
    }

    #[test]
    fn preflights_get_the_allow_headers_and_responses_echo_the_origin() {
        let g = guard(&[], &[], "127.0.0.1");
        let mut h = head(Some("localhost:11435"), Some("http://localhost:3000"));
        h.insert(
            header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        h.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("content-type, authorization"),
        );
        let pass = g.check(
            &Method::OPTIONS,
            &Uri::from_static("/v1/chat/completions"),
            &h,
        );
        let pass = pass.expect("allowed");
        assert!(matches!(pass, Pass::Preflight(_)));
        let mut out = HeaderMap::new();
        pass.decorate(&h, &mut out);
        assert_eq!(
            out[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://localhost:3000"
        );
        assert_eq!(
            out[header::ACCESS_CONTROL_ALLOW_HEADERS],
            "content-type, authorization"
        );
        assert!(out[header::ACCESS_CONTROL_ALLOW_METHODS]
            .to_str()
            .expect("ascii")
            .contains("POST"));
        // A plain request from the same origin: the origin echoed, no preflight headers.
        let pass =
            verdict(&g, Some("localhost:11435"), Some("http://localhost:3000")).expect("allowed");
        let mut out = HeaderMap::new();
        pass.decorate(&h, &mut out);
        assert_eq!(
            out[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://localhost:3000"
        );
        assert_eq!(out[header::VARY], "Origin");
        assert!(!out.contains_key(header::ACCESS_CONTROL_ALLOW_METHODS));
        // OPTIONS without Access-Control-Request-Method is no preflight.
        let plain = g.check(
            &Method::OPTIONS,
            &Uri::from_static("/"),
            &head(None, Some("http://localhost")),
        );
        assert!(matches!(plain, Ok(Pass::Cors(_))));
    }

    #[test]
    fn glob_matches_whole_text() {
        assert!(glob("a*c", "abc") && glob("a*c", "ac") && glob("*", "") && glob("a*b*c", "axbyc"));
        assert!(!glob("a*c", "abcd") && !glob("abc", "ab") && !glob("a*a", "a"));
    }
}
