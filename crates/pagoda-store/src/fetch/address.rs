//! Which network addresses a download may connect to, when a pull runs for someone other
//! than the operator (`POST /api/pull`): [`is_public`] and the [`public_only_resolver`] that
//! applies it to every connection a download makes — the URL's host, every redirect's host,
//! and each name's resolution at connect time (so a name that resolves to loopback, or
//! rebinds to it, is refused too).
//!
//! Invariant: with the resolver installed, no socket is opened to a loopback, private,
//! link-local, unique-local, shared (CGNAT), multicast, broadcast, documentation or
//! unspecified address, nor to an IPv4 address of those kinds written as IPv6.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        // 100.64.0.0/10: carrier-grade NAT, shared address space.
        || (a == 100 && (64..128).contains(&b))
        // 192.0.0.0/24: IETF protocol assignments; 198.18.0.0/15: benchmarking.
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (b == 18 || b == 19))
        // 240.0.0.0/4: reserved.
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, 2001:db8::/32 documentation.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        // ::/96 IPv4-compatible (deprecated) and 64:ff9b::/96 NAT64 can reach IPv4 hosts.
        || ip.segments()[..6].iter().all(|&s| s == 0)
        || (first == 0x0064 && ip.segments()[1] == 0xff9b))
}

/// Resolves `netloc` (`host:port`) and keeps only public addresses; an error naming the host
/// when none is left.
pub fn resolve_public(netloc: &str) -> io::Result<Vec<SocketAddr>> {
    let all: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
    let public: Vec<SocketAddr> = all.iter().copied().filter(|a| is_public(a.ip())).collect();
    if public.is_empty() {
        let host = netloc.rsplit_once(':').map_or(netloc, |(h, _)| h);
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{host} is not a public address (loopback, private and link-local addresses are refused for pulls over HTTP)"),
        ));
    }
    Ok(public)
}

/// Refuses a URL whose host is an address literal that is not public, before any connection
/// (names are checked when they resolve, by [`public_only_resolver`]).
pub fn check_literal(url: &url::Url) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    if is_public(ip) {
        Ok(())
    } else {
        Err(format!("{ip} is not a public address (loopback, private and link-local addresses are refused for pulls over HTTP)"))
    }
}

/// A ureq resolver that applies [`resolve_public`] to every connection.
pub fn public_only_resolver() -> impl ureq::Resolver {
    resolve_public
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for s in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip(s)), "{s}");
        }
    }

    #[test]
    fn ordinary_addresses_are_public() {
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip(s)), "{s}");
        }
    }

    #[test]
    fn loopback_names_resolve_to_nothing_allowed() {
        let e = resolve_public("127.0.0.1:80").expect_err("loopback refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("127.0.0.1"));
        assert!(resolve_public("localhost:80").is_err());
        assert!(resolve_public("[::1]:80").is_err());
    }

    #[test]
    fn private_address_literals_are_refused_before_connecting() {
        let url = |s: &str| url::Url::parse(s).expect("url");
        for private in [
            "http://127.0.0.1:9/x",
            "http://2130706433/x",
            "http://0x7f.1/x",
            "http://[::1]/x",
            "http://[::ffff:10.0.0.1]/x",
            "https://169.254.169.254/latest",
        ] {
            assert!(check_literal(&url(private)).is_err(), "{private}");
        }
        assert!(check_literal(&url("https://1.1.1.1/x")).is_ok());
        // Names are left to the resolver.
        assert!(check_literal(&url("http://localhost/x")).is_ok());
    }
}
