//! Property test of request handling: random bodies (arbitrary bytes, and JSON objects whose
//! fields are the APIs' own names with values of random types and sizes) sent to every
//! generation route, and to `/api/create`, `/api/copy` and `/api/rollback`, never crash the server or get a
//! 5xx; every error has a JSON body.

use crate::harness::{config, start, tiny_llama};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

const ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/api/generate",
    "/api/chat",
    "/api/show",
    "/api/embed",
    "/api/create",
    "/api/copy",
    "/api/rollback",
];

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "echo",
    "input",
    "options",
    "keep_alive",
    "raw",
    "system",
    "context",
    "format",
    "encoding_format",
    "suffix",
    "from",
    "modelfile",
    "parameters",
    "template",
    "source",
    "destination",
    "digest",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-3i64..40).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z \\n]{0,12}".prop_map(Value::from),
        Just(json!("user")),
        Just(json!(tiny_llama())),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                "role|content|include_usage|num_predict|[a-z]{1,6}",
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let object = proptest::collection::btree_map(proptest::sample::select(FIELDS), value(), 0..8)
        .prop_map(|m| {
            let mut o: Map<String, Value> =
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            // Mostly aim at the real model, so requests get past the lookup.
            o.entry("model").or_insert_with(|| json!(tiny_llama()));
            if let Some(Value::Number(n)) = o.get("max_tokens") {
                if n.as_i64().is_some_and(|v| v > 16) {
                    o.insert("max_tokens".into(), json!(16));
                }
            }
            o.entry("max_tokens").or_insert(json!(8));
            o.entry("options").or_insert(json!({"num_predict": 8}));
            serde_json::to_vec(&Value::Object(o)).unwrap_or_default()
        });
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        4 => object,
    ]
}

#[test]
fn random_bodies_never_crash_the_server_or_get_a_5xx() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(start(config()));
    let mut runner = TestRunner::new(Config {
        cases: 160,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(proptest::sample::select(ROUTES), body()),
        |(route, body)| {
            let (status, text) = rt.block_on(async {
                let r = s.post_raw(route, body.clone()).await;
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            });
            prop_assert!(
                status < 500,
                "{route} got {status}: {text}\nbody: {}",
                String::from_utf8_lossy(&body)
            );
            if status >= 400 {
                let v: Result<Value, _> = serde_json::from_str(&text);
                prop_assert!(
                    v.is_ok_and(|v| v.get("error").is_some()),
                    "{route} {status}: {text}"
                );
            }
            Ok(())
        },
    );
    // Still serving, and nothing left holding KV blocks.
    let ok = rt.block_on(s.post(
        "/v1/chat/completions",
        json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
    ));
    assert_eq!(ok.status(), 200);
    assert!(rt.block_on(s.wait_kv_empty()));
    rt.block_on(s.stop()).expect("clean stop");
    if let Err(e) = result {
        panic!("{e}");
    }
}
