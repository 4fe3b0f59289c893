//! Replicas found in DNS: a target's `discover = "http://NAME:PORT"` names a DNS name whose
//! A/AAAA records are the replicas (a Kubernetes headless Service lists its ready pods so),
//! resolved again every `discover_interval_ms`; [`spawn_discovery`] feeds each answer to
//! [`Upstreams::set_discovered`], so replicas that appear join balancing, health checks and
//! circuit breaking and those that vanish leave them, with in-flight requests finishing.
//!
//! Invariants: a failed lookup (resolver down, timeout) keeps the replicas last found — a DNS
//! hiccup must not empty a healthy pool; health checks and breakers handle dead addresses. An
//! answer is taken whole (sorted, deduplicated), so two gateways resolving the same name see
//! the same replica set and prefix affinity sends a prefix to the same replica from both.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Upstreams;

/// How long one lookup may take before it counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed `discover` value: the scheme and port of every replica and the name to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySpec {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl DiscoverySpec {
    /// Parses `http://NAME:PORT` or `https://NAME:PORT` (the port defaults to the scheme's;
    /// no path, query, user or password).
    pub fn parse(s: &str) -> Result<DiscoverySpec, String> {
        let url = reqwest::Url::parse(s)
            .map_err(|e| format!("`{s}` is not a URL ({e}); write http://service-name:port"))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(format!("`{s}`: the scheme must be http or https"));
        }
        if !(url.path().is_empty() || url.path() == "/")
            || url.query().is_some()
            || url.fragment().is_some()
            || !url.username().is_empty()
            || url.password().is_some()
        {
            return Err(format!(
                "`{s}`: only a scheme, a DNS name and a port (no path, query or credentials)"
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| format!("`{s}` names no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("`{s}` has no port"))?;
        Ok(DiscoverySpec {
            scheme: url.scheme().to_string(),
            host,
            port,
        })
    }

    /// The replica base URLs for `addresses`, sorted and deduplicated.
    pub fn urls(&self, addresses: &[IpAddr]) -> Vec<String> {
        let mut urls: Vec<String> = addresses
            .iter()
            .map(|ip| match ip {
                IpAddr::V4(v4) => format!("{}://{v4}:{}", self.scheme, self.port),
                IpAddr::V6(v6) => format!("{}://[{v6}]:{}", self.scheme, self.port),
            })
            .collect();
        urls.sort();
        urls.dedup();
        urls
    }
}

/// The lookup's answer: the addresses of a name, or why there are none.
pub type Lookup = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a DNS name to its addresses (A and AAAA records).
pub trait Resolve: Send + Sync + 'static {
    fn lookup(&self, host: &str, port: u16) -> Lookup;
}

/// The system resolver (getaddrinfo through tokio: /etc/hosts, then the cluster's DNS).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn lookup(&self, host: &str, port: u16) -> Lookup {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), port)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// Resolves every discovering target of `upstreams` now; returns (target, URL) of the
/// replicas that left. A lookup that fails or times out leaves its target as it was.
pub async fn discover_once(upstreams: &Upstreams, resolver: &dyn Resolve) -> Vec<(String, String)> {
    discover_targets(upstreams, resolver, |_| true).await
}

/// [`discover_once`] for the targets `due` accepts.
async fn discover_targets(
    upstreams: &Upstreams,
    resolver: &dyn Resolve,
    due: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let mut gone = Vec::new();
    for (target, discover, _) in upstreams.discovering() {
        if !due(&target) {
            continue;
        }
        let Ok(spec) = DiscoverySpec::parse(&discover) else {
            continue; // validated with the config; a bad value cannot get here
        };
        match tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup(&spec.host, spec.port)).await {
            Ok(Ok(addresses)) => {
                let urls = spec.urls(&addresses);
                for url in upstreams.set_discovered(&target, urls) {
                    gone.push((target.clone(), url));
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(%target, host = %spec.host, error = %e, "replica discovery: lookup failed; keeping the replicas last found");
            }
            Err(_) => {
                tracing::warn!(%target, host = %spec.host, "replica discovery: lookup timed out; keeping the replicas last found");
            }
        }
    }
    gone
}

/// How often the discovery task wakes to see which targets are due.
const TICK: Duration = Duration::from_millis(100);

/// Resolves each discovering target at once and then every `discover_interval_ms` of its own
/// (a reload that adds or changes `discover` is seen within [`TICK`]); `on_gone(target, url)`
/// is called for each replica that left.
pub fn spawn_discovery(
    upstreams: Arc<Upstreams>,
    resolver: Arc<dyn Resolve>,
    on_gone: impl Fn(&str, &str) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut next_due: HashMap<String, Instant> = HashMap::new();
        loop {
            let now = Instant::now();
            let targets = upstreams.discovering();
            next_due.retain(|t, _| targets.iter().any(|(name, _, _)| name == t));
            let due: Vec<String> = targets
                .iter()
                .filter(|(t, _, _)| next_due.get(t).is_none_or(|at| *at <= now))
                .map(|(t, _, _)| t.clone())
                .collect();
            for (t, _, every) in &targets {
                if due.contains(t) {
                    next_due.insert(t.clone(), now + *every);
                }
            }
            if !due.is_empty() {
                let gone = discover_targets(&upstreams, resolver.as_ref(), |t| {
                    due.iter().any(|d| d == t)
                })
                .await;
                for (target, url) in gone {
                    on_gone(&target, &url);
                }
            }
            tokio::time::sleep(TICK).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GatewayConfig, TargetConfig};
    use std::sync::Mutex;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s = DiscoverySpec::parse("http://pagoda-server-pods.pagoda.svc.cluster.local:11435")
            .unwrap();
        assert_eq!(
            (s.scheme.as_str(), s.host.as_str(), s.port),
            ("http", "pagoda-server-pods.pagoda.svc.cluster.local", 11435)
        );
        assert_eq!(DiscoverySpec::parse("https://svc").unwrap().port, 443);
        assert_eq!(DiscoverySpec::parse("http://svc:80/").unwrap().port, 80);
        for (bad, why) in [
            ("svc:80", "scheme"),
            ("ftp://svc:21", "scheme"),
            ("http://svc:80/v1", "no path"),
            ("http://user:pw@svc:80", "credentials"),
            ("http://svc:80?x=1", "query"),
            ("not a url", "not a URL"),
        ] {
            let e = DiscoverySpec::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn addresses_become_sorted_unique_urls() {
        let s = DiscoverySpec::parse("http://svc:8000").unwrap();
        let ips: Vec<IpAddr> = ["10.0.0.2", "10.0.0.1", "::1", "10.0.0.2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            s.urls(&ips),
            [
                "http://10.0.0.1:8000",
                "http://10.0.0.2:8000",
                "http://[::1]:8000"
            ]
        );
    }

    /// Answers from a list the test changes; `None` is a failed lookup.
    struct Scripted(Mutex<Option<Vec<IpAddr>>>);

    impl Resolve for Scripted {
        fn lookup(&self, host: &str, _port: u16) -> Lookup {
            assert_eq!(host, "svc");
            let answer = self.0.lock().unwrap().clone();
            Box::pin(async move { answer.ok_or_else(|| std::io::Error::other("SERVFAIL")) })
        }
    }

    fn config(static_replicas: &[&str]) -> GatewayConfig {
        GatewayConfig {
            targets: vec![TargetConfig {
                name: "t".into(),
                model: None,
                replicas: static_replicas.iter().map(|s| s.to_string()).collect(),
                canned_reply: None,
                max_concurrency: 4,
                queue_timeout_ms: 100,
                timeout_ms: 0,
                api_key: None,
                discover: Some("http://svc:9000".into()),
                discover_interval_ms: 100,
            }],
            breaker: crate::config::BreakerConfig {
                failure_threshold: 1,
                open_ms: 60_000,
                half_open_probes: 1,
            },
            ..GatewayConfig::default()
        }
    }

    fn urls(ups: &Upstreams) -> Vec<String> {
        let pool = ups.pool("t").expect("a discovering target has a pool");
        pool.replicas().iter().map(|r| r.url.clone()).collect()
    }

    fn ips(list: &[&str]) -> Option<Vec<IpAddr>> {
        Some(list.iter().map(|a| a.parse().unwrap()).collect())
    }

    #[tokio::test]
    async fn replicas_join_and_leave_with_the_answers_and_keep_their_state() {
        let ups = Upstreams::new(&config(&["http://static:1"]));
        assert_eq!(
            urls(&ups),
            ["http://static:1"],
            "a pool before the first answer"
        );
        let resolver = Scripted(Mutex::new(ips(&["10.0.0.2", "10.0.0.1"])));

        assert!(discover_once(&ups, &resolver).await.is_empty());
        assert_eq!(
            urls(&ups),
            [
                "http://static:1",
                "http://10.0.0.1:9000",
                "http://10.0.0.2:9000"
            ]
        );
        let pool = ups.pool("t").unwrap();
        let kept = pool.replicas()[2].clone();
        kept.record_failure();

        // 10.0.0.1 goes, 10.0.0.3 comes; 10.0.0.2 stays the same replica (same breaker).
        *resolver.0.lock().unwrap() = ips(&["10.0.0.3", "10.0.0.2"]);
        let gone = discover_once(&ups, &resolver).await;
        assert_eq!(
            gone,
            [("t".to_string(), "http://10.0.0.1:9000".to_string())]
        );
        assert_eq!(
            urls(&ups),
            [
                "http://static:1",
                "http://10.0.0.2:9000",
                "http://10.0.0.3:9000"
            ]
        );
        let still = ups.pool("t").unwrap().replicas()[1].clone();
        assert!(Arc::ptr_eq(&still, &kept));
        assert_eq!(still.breaker_state(), crate::upstream::BreakerState::Open);

        // A failed lookup changes nothing; an empty answer empties the discovered part.
        *resolver.0.lock().unwrap() = None;
        assert!(discover_once(&ups, &resolver).await.is_empty());
        assert_eq!(urls(&ups).len(), 3);
        *resolver.0.lock().unwrap() = Some(Vec::new());
        assert_eq!(discover_once(&ups, &resolver).await.len(), 2);
        assert_eq!(urls(&ups), ["http://static:1"]);

        // A reload without `discover` drops what was discovered.
        *resolver.0.lock().unwrap() = ips(&["10.0.0.9"]);
        discover_once(&ups, &resolver).await;
        assert_eq!(urls(&ups).len(), 2);
        let mut plain = config(&["http://static:1"]);
        plain.targets[0].discover = None;
        ups.reconcile(&plain);
        assert_eq!(urls(&ups), ["http://static:1"]);
        assert!(ups.discovering().is_empty());
    }

    #[tokio::test]
    async fn a_discovering_target_without_replicas_has_an_empty_pool() {
        let ups = Upstreams::new(&config(&[]));
        assert!(urls(&ups).is_empty());
        assert!(ups
            .pool("t")
            .unwrap()
            .pick(&crate::upstream::Pick::LeastOutstanding)
            .is_none());
    }

    #[tokio::test]
    async fn the_spawned_task_resolves_and_reports_departures() {
        let ups = Arc::new(Upstreams::new(&config(&[])));
        let resolver = Arc::new(Scripted(Mutex::new(ips(&["127.0.0.1"]))));
        let gone = Arc::new(Mutex::new(Vec::new()));
        let seen = gone.clone();
        let task = spawn_discovery(ups.clone(), resolver.clone(), move |t, u| {
            seen.lock().unwrap().push(format!("{t} {u}"))
        });
        let wait_for = |n: usize| {
            let ups = ups.clone();
            async move {
                for _ in 0..100 {
                    if urls(&ups).len() == n {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            }
        };
        assert!(wait_for(1).await);
        *resolver.0.lock().unwrap() = Some(Vec::new());
        assert!(wait_for(0).await);
        task.abort();
        assert_eq!(*gone.lock().unwrap(), ["t http://127.0.0.1:9000"]);
    }

    /// Counts lookups per host; answers 127.0.0.1.
    #[derive(Default)]
    struct Counting(Mutex<HashMap<String, usize>>);

    impl Resolve for Counting {
        fn lookup(&self, host: &str, _port: u16) -> Lookup {
            *self.0.lock().unwrap().entry(host.to_string()).or_default() += 1;
            Box::pin(async { Ok(vec!["127.0.0.1".parse().unwrap()]) })
        }
    }

    #[tokio::test]
    async fn each_target_is_resolved_at_its_own_interval() {
        let mut cfg = config(&[]);
        let mut slow = cfg.targets[0].clone();
        slow.name = "slow".into();
        slow.discover = Some("http://slow-svc:9000".into());
        slow.discover_interval_ms = 60_000;
        cfg.targets[0].discover = Some("http://fast-svc:9000".into());
        cfg.targets.push(slow);
        let ups = Arc::new(Upstreams::new(&cfg));
        let resolver = Arc::new(Counting::default());
        let task = spawn_discovery(ups, resolver.clone(), |_, _| {});
        tokio::time::sleep(Duration::from_millis(700)).await;
        task.abort();
        let counts = resolver.0.lock().unwrap().clone();
        assert_eq!(counts.get("slow-svc"), Some(&1), "{counts:?}");
        assert!(
            counts.get("fast-svc").is_some_and(|&n| n >= 4),
            "{counts:?}"
        );
    }

    #[tokio::test]
    async fn the_system_resolver_finds_localhost() {
        let addrs = SystemResolver.lookup("localhost", 80).await.unwrap();
        assert!(addrs.iter().any(IpAddr::is_loopback), "{addrs:?}");
    }
}
