//! The runner against a tiny in-process OpenAI-style SSE stub on a loopback socket: counts,
//! HTTP errors, stream error events, cut streams, warm-up, Poisson with a duration, and an
//! unreachable server.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use pagoda_bench::workload::{Endpoint, WorkloadOptions};
use pagoda_bench::{run, Arrival, BenchError, Limit, RunConfig, Workload};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The first `loading` requests get a 503 (models loading); after them, every
/// `fail_every`-th request (counted over all, from 1) gets a 500; 0 = never.
struct Stub {
    fail_every: u64,
    loading: u64,
    served: AtomicU64,
}

async fn start(fail_every: u64) -> String {
    start_loading(fail_every, 0).await
}

async fn start_loading(fail_every: u64, loading: u64) -> String {
    let stub = Arc::new(Stub {
        fail_every,
        loading,
        served: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/v1/completions", post(complete))
        .route("/v1/chat/completions", post(complete))
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "stub-model"}]})) }),
        )
        .with_state(stub);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Small SSE writes go out at once (as pagoda serve does), not after a delayed ACK.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// Streams four content chunks 10 ms apart (the prompt "error-event" sends an error event
/// instead of the third, "cut" ends without `[DONE]`), then usage and `[DONE]`.
async fn complete(State(stub): State<Arc<Stub>>, Json(body): Json<Value>) -> Response {
    let n = stub.served.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= stub.loading {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"message": "still loading", "type": "server_error"}})),
        )
            .into_response();
    }
    if stub.fail_every > 0 && n % stub.fail_every == 0 {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": {"message": "stub failure", "type": "server_error"}})),
        )
            .into_response();
    }
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert!(body["max_tokens"].as_u64().is_some());
    let chat = body.get("messages").is_some();
    let prompt = body["prompt"].as_str().unwrap_or("").to_string();
    let chunk = |text: &str| {
        if chat {
            json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        } else {
            json!({"choices": [{"index": 0, "text": text}]})
        }
    };
    let mut events = vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            .to_string(),
    ];
    for i in 0..4 {
        if i == 2 && prompt == "error-event" {
            events.push(json!({"error": {"message": "engine fell over"}}).to_string());
        }
        events.push(chunk(&format!("t{i}")).to_string());
    }
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}})
            .to_string(),
    );
    if prompt != "cut" {
        events.push("[DONE]".into());
    }
    let stream =
        futures_util::StreamExt::then(futures_util::stream::iter(events), |e| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, std::io::Error>(Bytes::from(format!("data: {e}\n\n")))
        });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn config(url: &str, arrival: Arrival, limit: Limit, warmup: usize) -> RunConfig {
    RunConfig {
        base_url: format!("{url}/v1"),
        api_key: Some("sk-test".into()),
        arrival,
        warmup_requests: warmup,
        limit,
        seed: 0,
        timeout: Duration::from_secs(10),
    }
}

fn prompts(text: &str) -> Workload {
    Workload::from_jsonl(text, "test", WorkloadOptions::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_counts_requests_errors_and_latencies() {
    let url = start(4).await;
    let cfg = config(&url, Arrival::Concurrency(3), Limit::Requests(12), 2);
    let mut workload = prompts(
        "{\"prompt\": \"ok\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"ok\"}]}",
    );
    let mut max_in_flight = 0;
    let mut warm_seen = false;
    let report = run(&cfg, &mut workload, |p| {
        max_in_flight = max_in_flight.max(p.in_flight);
        warm_seen |= p.warmup;
    })
    .await
    .unwrap();
    assert!(warm_seen, "the warm-up reports progress");
    assert!(max_in_flight <= 3);
    assert_eq!(
        report.records.len(),
        12,
        "warm-up requests are not measured"
    );
    // The server counts warm-up requests too: measured ones are its 3rd..14th; 4, 8, 12 fail.
    let s = report.summary(None);
    assert_eq!((s.requests, s.completed, s.errors), (12, 9, 3));
    assert_eq!(s.error_counts.get("HTTP 500: stub failure"), Some(&3));
    assert_eq!((s.output_tokens, s.input_tokens), (36, 63));
    for r in report.records.iter().filter(|r| r.error.is_none()) {
        let ttft = r.ttft_s.unwrap();
        assert!(ttft > 0.0 && ttft < r.e2e_s(), "{r:?}");
        assert_eq!(r.itl_s.len(), 3);
        // Events 10 ms apart; two may arrive in one read, so only their sum is bounded.
        assert!(r.itl_s.iter().sum::<f64>() > 0.015, "{r:?}");
        assert!(
            ttft + r.itl_s.iter().sum::<f64>() <= r.e2e_s() + 1e-9,
            "{r:?}"
        );
    }
    assert_eq!(s.tpot_ms.count, 9);
    assert!(s.ttft_ms.p50 > 0.0 && s.e2e_ms.p50 > s.ttft_ms.p50);
    assert!(s.request_throughput > 0.0 && s.duration_s > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_errors_and_cut_streams_are_errors() {
    let url = start(0).await;
    let cfg = config(&url, Arrival::Concurrency(1), Limit::Requests(3), 0);
    let mut workload =
        prompts("{\"prompt\": \"error-event\"}\n{\"prompt\": \"cut\"}\n{\"prompt\": \"ok\"}");
    let report = run(&cfg, &mut workload, |_| {}).await.unwrap();
    let errors: Vec<_> = report.records.iter().map(|r| r.error.clone()).collect();
    assert_eq!(
        errors,
        vec![
            Some("stream error: engine fell over".to_string()),
            Some("the stream ended before [DONE]".to_string()),
            None
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisson_with_a_duration_stops_starting_at_the_deadline() {
    let url = start(0).await;
    let cfg = config(
        &url,
        Arrival::Poisson { rate: 40.0 },
        Limit::Duration(Duration::from_millis(500)),
        0,
    );
    let mut workload = Workload::random(
        pagoda_bench::workload::RandomLengths {
            input_len: 16,
            input_len_range: 0.5,
            output_len: 4,
            output_len_range: 0.0,
        },
        1,
        WorkloadOptions {
            prompt_endpoint: Endpoint::Chat,
            ..WorkloadOptions::default()
        },
    )
    .unwrap();
    let report = run(&cfg, &mut workload, |_| {}).await.unwrap();
    let n = report.records.len();
    // 40/s for 0.5 s: 20 expected; a seeded draw, so a wide band.
    assert!((5..=45).contains(&n), "{n} requests");
    assert!(report
        .records
        .iter()
        .all(|r| r.start_s < 0.55 && r.error.is_none()));
    // Random prompts: the server's usage wins over the word-count hint.
    assert!(report.records.iter().all(|r| r.prompt_tokens == 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_warmup_and_unreachable_servers_are_clear_errors() {
    let url = start(1).await;
    let cfg = config(&url, Arrival::Concurrency(2), Limit::Requests(4), 2);
    let err = run(&cfg, &mut prompts("{\"prompt\": \"ok\"}"), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BenchError::WarmupFailed { count: 2, first } if first.contains("HTTP 500")),
        "{err}"
    );
    assert_eq!(
        pagoda_bench::runner::list_models(&cfg).await.unwrap(),
        vec!["stub-model".to_string()]
    );
    // A closed port: listing models says so; requests record connection errors.
    let closed = config(
        "http://127.0.0.1:9",
        Arrival::Concurrency(1),
        Limit::Requests(2),
        0,
    );
    let err = pagoda_bench::runner::list_models(&closed)
        .await
        .unwrap_err();
    assert!(matches!(err, BenchError::Unreachable { .. }), "{err}");
    let report = run(&closed, &mut prompts("{\"prompt\": \"ok\"}"), |_| {})
        .await
        .unwrap();
    assert_eq!(report.summary(None).errors, 2);
    assert!(report.records[0]
        .error
        .as_deref()
        .unwrap()
        .starts_with("connection failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_warmup_request_waits_out_a_loading_server() {
    // Three 503s, then service: the warm-up absorbs them and nothing measured fails.
    let url = start_loading(0, 3).await;
    let cfg = config(&url, Arrival::Concurrency(2), Limit::Requests(4), 1);
    let report = run(&cfg, &mut prompts("{\"prompt\": \"ok\"}"), |_| {})
        .await
        .unwrap();
    assert_eq!(report.summary(None).completed, 4);
    // Without a warm-up the 503s are measured as errors.
    let url = start_loading(0, 3).await;
    let cfg = config(&url, Arrival::Concurrency(1), Limit::Requests(4), 0);
    let report = run(&cfg, &mut prompts("{\"prompt\": \"ok\"}"), |_| {})
        .await
        .unwrap();
    let s = report.summary(None);
    assert_eq!((s.completed, s.errors), (1, 3));
    assert_eq!(s.error_counts.get("HTTP 503: still loading"), Some(&3));
}
