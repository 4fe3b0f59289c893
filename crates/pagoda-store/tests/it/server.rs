//! A tiny HTTP/1.1 server on 127.0.0.1 for URL and Hugging Face tests (no internet).
//!
//! Owns the fake routes: each path answers with a body, a status, a redirect, a body cut short
//! of its Content-Length, or a body only for the right bearer token. Records every request.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum Route {
    Body(Vec<u8>),
    Status(u16),
    /// Sends `body` but claims `claimed` bytes, then closes the connection.
    Truncated {
        body: Vec<u8>,
        claimed: usize,
    },
    /// 302 to this location (any text: another server, `file:///...`, a relative path).
    Redirect(String),
    /// 401 unless `Authorization: Bearer <token>`.
    NeedsToken {
        token: String,
        body: Vec<u8>,
    },
    /// First request: cut after `cut_at` bytes. Later ones: honour `Range: bytes=N-` with a 206
    /// when `ranges` is true, else send the whole body with a 200.
    Flaky {
        body: Vec<u8>,
        cut_at: usize,
        ranges: bool,
        served: Arc<AtomicUsize>,
    },
}

#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub authorization: Option<String>,
    pub range: Option<String>,
}

pub struct Server {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl Server {
    pub fn start(routes: Vec<(&str, Route)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let routes: Arc<HashMap<String, Route>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_string(), r))
                .collect(),
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let routes = routes.clone();
                let log = log.clone();
                std::thread::spawn(move || {
                    let _ = handle(stream, &routes, &log);
                });
            }
        });
        Server { base, requests }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn hits(&self, path: &str) -> usize {
        self.requests
            .lock()
            .map(|r| r.iter().filter(|q| q.path == path).count())
            .unwrap_or(0)
    }
}

fn handle(
    mut stream: TcpStream,
    routes: &HashMap<String, Route>,
    log: &Mutex<Vec<Request>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut authorization = None;
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                authorization = Some(v.trim().to_string());
            }
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    if let Ok(mut l) = log.lock() {
        l.push(Request {
            path: path.clone(),
            authorization: authorization.clone(),
            range: range.clone(),
        });
    }
    let reply = |stream: &mut TcpStream, status: u16, body: &[u8], claimed: usize| {
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        stream.flush()
    };
    match routes.get(&path) {
        None => reply(&mut stream, 404, b"nope", 4),
        Some(Route::Body(b)) => reply(&mut stream, 200, b, b.len()),
        Some(Route::Status(s)) => reply(&mut stream, *s, b"err", 3),
        Some(Route::Redirect(location)) => {
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes())?;
            stream.flush()
        }
        Some(Route::Truncated { body, claimed }) => reply(&mut stream, 200, body, *claimed),
        Some(Route::Flaky {
            body,
            cut_at,
            ranges,
            served,
        }) => {
            if served.fetch_add(1, Ordering::SeqCst) == 0 {
                return reply(&mut stream, 200, &body[..*cut_at], body.len());
            }
            let start = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
            match start {
                Some(n) if *ranges && n <= body.len() => {
                    reply(&mut stream, 206, &body[n..], body.len() - n)
                }
                _ => reply(&mut stream, 200, body, body.len()),
            }
        }
        Some(Route::NeedsToken { token, body }) => {
            if authorization.as_deref() == Some(&format!("Bearer {token}")) {
                reply(&mut stream, 200, body, body.len())
            } else {
                reply(&mut stream, 401, b"denied", 6)
            }
        }
    }
}
