//! `pagoda batch` and `pagoda serve` answer the same request the same way: the same lines
//! sent to a running server and run as a batch job give the same status and body (ids and
//! timestamps aside), successes and refusals alike; and the operator limits a server adds
//! (`--max-tokens-limit`, `priority` under `--policy priority`) hold over HTTP.

use super::*;
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A `pagoda serve` child on a free port, killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(env: &Env, model: &Path, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = env
            .cmd()
            .args(["serve", "-m", model.to_str().unwrap(), "--port"])
            .arg(port.to_string())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while ureq::get(&format!("{}/ready", server.base)).call().is_err() {
            assert!(Instant::now() < deadline, "the server did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// POSTs `body` to `path`: the status and the JSON body, whatever the status.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let response = match ureq::post(&url).send_json(body) {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{path}: {e}"),
        };
        let status = response.status();
        (status, response.into_json().expect("a JSON body"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body without what differs by construction: ids, the clock, and how much of the
/// prompt the prefix cache held (the server answers the lines one after another, the batch
/// job runs them together).
fn comparable(mut body: Value) -> Value {
    if let Some(o) = body.as_object_mut() {
        o.remove("id");
        o.remove("created");
    }
    if let Some(usage) = body.get_mut("usage").and_then(Value::as_object_mut) {
        usage.remove("prompt_tokens_details");
    }
    body
}

/// Whether two bodies are the same, numbers within `1e-4`: a prompt prefilled in another
/// chunking or read back from the prefix cache moves log-probabilities in the last digits.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-4,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Runs `lines` (url, body) through `pagoda batch` with `extra` flags: (status, body) each.
fn batch(env: &Env, model: &Path, lines: &[(&str, Value)], extra: &[&str]) -> Vec<(u16, Value)> {
    let input = env.dir.path().join("same.jsonl");
    let output = env.dir.path().join("same.out.jsonl");
    let text: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, (url, body))| {
            json!({"custom_id": i.to_string(), "method": "POST", "url": url, "body": body})
                .to_string()
        })
        .collect();
    fs::write(&input, text.join("\n")).unwrap();
    let mut args = vec![
        "batch",
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(&env.run(&args));
    fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            let status = line["response"]["status_code"].as_u64().unwrap() as u16;
            (status, line["response"]["body"].clone())
        })
        .collect()
}

#[test]
fn batch_and_serve_give_the_same_answers_and_the_same_errors() {
    let env = Env::new();
    let model = tiny_llama_copy(&env, "tiny-same", |_| {});
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    let hi = json!([{"role": "user", "content": "hi there"}]);
    let lines: Vec<(&str, Value)> = vec![
        (
            completions,
            json!({"prompt": "hello there", "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
        ),
        (
            completions,
            json!({"prompt": "once upon", "max_tokens": 4, "logprobs": 2, "temperature": 0, "ignore_eos": true}),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 4, "n": 2, "temperature": 0.8, "seed": 3, "ignore_eos": true}),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "temperature": 0}),
        ),
        // Without max_tokens: the ceiling (--max-tokens-limit 6 on both sides).
        (
            chat,
            json!({"messages": hi, "temperature": 0, "ignore_eos": true}),
        ),
        // Structured output goes through the same path (issue 22).
        (
            chat,
            json!({"messages": hi, "max_tokens": 3, "temperature": 0,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}}),
        ),
        // Refusals, each naming its field.
        (
            chat,
            json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {"name": "r"}}}),
        ),
        (chat, json!({"messages": hi, "frobnicate": 1})),
        (chat, json!({"messages": hi, "top_p": 1.5})),
        (chat, json!({"messages": hi, "max_tokens": 7})),
        (chat, json!({"messages": hi, "n": 0})),
        (chat, json!({"messages": hi, "top_logprobs": 2})),
        (chat, json!({"messages": hi, "priority": 5})),
        (
            chat,
            json!({"messages": hi, "tools": [{"type": "function", "function": {"description": "no name"}}]}),
        ),
        (chat, json!({"messages": []})),
        (
            chat,
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
        ),
        (chat, json!({"messages": hi, "logit_bias": {"x": 1}})),
        (
            completions,
            json!({"prompt": vec![1; 5000], "max_tokens": 2}),
        ),
        (completions, json!({"prompt": "x", "suffix": "y"})),
        (chat, json!({"messages": "not a list"})),
    ];
    let name = model.to_str().unwrap();
    let lines: Vec<(&str, Value)> = lines
        .into_iter()
        .map(|(url, mut body)| {
            body["model"] = json!(name);
            (url, body)
        })
        .collect();
    let limit = ["--max-tokens-limit", "6"];
    let batched = batch(&env, &model, &lines, &limit);
    let server = Server::start(&env, &model, &limit);
    let mut refused = 0;
    for (i, ((url, body), (batch_status, batch_body))) in lines.iter().zip(batched).enumerate() {
        let (status, served) = server.post(url, body);
        assert_eq!(status, batch_status, "line {i}: {served} vs {batch_body}");
        let (served, batched) = (comparable(served), comparable(batch_body.clone()));
        assert!(
            same(&served, &batched),
            "line {i} ({url} {body}):\n served {served}\nbatched {batched}"
        );
        if status == 400 {
            refused += 1;
            let error = &batch_body["error"];
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "line {i}"
            );
        }
        if i == 4 {
            assert_eq!(batch_body["usage"]["completion_tokens"], 6, "the ceiling");
            assert_eq!(batch_body["choices"][0]["finish_reason"], "length");
        }
    }
    assert_eq!(refused, 14, "every refusal line was refused");
}

#[test]
fn priority_over_http_runs_the_urgent_request_first_and_still_serves_the_rest() {
    let env = Env::new();
    let model = tiny_llama_copy(&env, "tiny-priority", |_| {});
    let server = Server::start(
        &env,
        &model,
        &["--policy", "priority", "--max-num-seqs", "1"],
    );
    let server = std::sync::Arc::new(server);
    let long = |priority: i64| {
        json!({"model": "", "prompt": "hello there", "max_tokens": 200, "temperature": 0,
               "ignore_eos": true, "priority": priority})
    };
    let started = Instant::now();
    let spawn = |body: Value| {
        let server = server.clone();
        std::thread::spawn(move || {
            let (status, _) = server.post("/v1/completions", &body);
            (status, started.elapsed())
        })
    };
    // A queue of low-priority requests (one runs at a time), then an urgent one behind it.
    let low: Vec<_> = (0..12).map(|_| spawn(long(5))).collect();
    std::thread::sleep(Duration::from_millis(50));
    // vLLM's meaning: lower runs earlier.
    let urgent = spawn(long(-5)).join().unwrap();
    let lows: Vec<(u16, Duration)> = low.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(urgent.0, 200);
    assert!(
        lows.iter().all(|(s, _)| *s == 200),
        "every low request is served: {lows:?}"
    );
    let later = lows.iter().filter(|(_, t)| *t > urgent.1).count();
    assert!(
        later >= 6,
        "the urgent request finished before the queued low ones: urgent {:?}, low {lows:?}",
        urgent.1
    );
}
