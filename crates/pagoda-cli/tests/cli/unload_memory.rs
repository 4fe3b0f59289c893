//! Unloading a model gives its memory back to the operating system (issue 41, point 1): a
//! server that loads and unloads a model over and over keeps the RSS it had after the first
//! cycle, rather than growing by a model's worth of allocator free lists per cycle (it grew
//! ~80 MiB a cycle with SmolLM2 before `pagoda_server::heap`).
//!
//! The model: SmolLM2 when `PAGODA_TEST_SMOLLM2` names it (scripts/test.sh): its load makes the
//! mid-size allocations glibc's dynamic thresholds kept (RSS 29 → 71 → 109 MiB over cycles
//! without `pagoda_server::heap`, 25-27 MiB with it). Else a Llama of ~90 MiB of f32 weights
//! made here, which catches an unloaded model that is never freed (a handle kept alive) but
//! not the allocator's retention, since its weights are read from the file's mapping.

use super::*;
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How much the RSS may grow over the cycles after the first.
const SLACK_MIB: u64 = 30;

/// Load/unload cycles measured after the baseline's.
const CYCLES: usize = 4;

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(env: &Env, model: &str) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = env
            .cmd()
            .args(["serve", "-m", model, "--threads", "2", "--port"])
            .arg(port.to_string())
            // The allocator as a user runs it: no tuning from the test's environment.
            .env_remove("MALLOC_MMAP_THRESHOLD_")
            .env_remove("MALLOC_TRIM_THRESHOLD_")
            .env_remove("MALLOC_ARENA_MAX")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while ureq::get(&format!("{}/ready", server.base)).call().is_err() {
            assert!(Instant::now() < deadline, "the server did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn generate(&self, body: Value) -> Value {
        ureq::post(&format!("{}/api/generate", self.base))
            .send_json(body)
            .unwrap_or_else(|e| panic!("/api/generate: {e}"))
            .into_json()
            .expect("a JSON body")
    }

    fn loaded(&self) -> usize {
        let ps: Value = ureq::get(&format!("{}/api/ps", self.base))
            .call()
            .expect("/api/ps")
            .into_json()
            .expect("JSON");
        ps["models"].as_array().map_or(0, Vec::len)
    }

    /// Resident memory now, in MiB (`VmRSS` of /proc/PID/status).
    fn rss_mib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("a VmRSS line");
        kib / 1024
    }

    /// One cycle: load `model` and generate with it, then unload it and wait until it is
    /// gone and the RSS has settled; returns the RSS then.
    fn cycle(&self, model: &str) -> u64 {
        let r = self.generate(json!({
            "model": model, "prompt": "ab a", "stream": false,
            "options": {"num_predict": 4, "temperature": 0}
        }));
        assert_eq!(r["done"], true, "{r}");
        let r = self.generate(json!({"model": model, "keep_alive": 0}));
        assert_eq!(r["done_reason"], "unload", "{r}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.loaded() > 0 {
            assert!(Instant::now() < deadline, "the model stayed loaded");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The engine stops and the memory is released on a thread of its own: settle.
        let mut last = self.rss_mib();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(250));
            let now = self.rss_mib();
            if now == last {
                break;
            }
            last = now;
        }
        last
    }
}

#[test]
fn unloading_a_model_returns_its_memory_to_the_os() {
    if !Path::new("/proc/self/status").exists() {
        eprintln!("skipping: no /proc to read the RSS from");
        return;
    }
    let env = Env::new();
    let model = match std::env::var("PAGODA_TEST_SMOLLM2") {
        Ok(path) => path,
        Err(_) => {
            // 2 layers of 1024 x 2816: ~90 MiB in 20 tensors of 2-11 MiB.
            let p = env.file("big.gguf", &llama_gguf(3, (1024, 2816, 2), 256, None));
            p.display().to_string()
        }
    };
    let server = Server::start(&env, &model);
    let started = server.rss_mib();
    // The first cycle's RSS is the baseline: what a server keeps for good (thread pools,
    // the first allocations of each arena) is in it.
    let baseline = server.cycle(&model);
    let mut after = Vec::new();
    for _ in 0..CYCLES {
        after.push(server.cycle(&model));
    }
    let last = *after.last().unwrap();
    eprintln!("RSS MiB: started {started}, after the first cycle {baseline}, then {after:?}");
    assert!(
        last <= baseline + SLACK_MIB,
        "RSS grew from {baseline} MiB to {last} MiB over {CYCLES} load/unload cycles \
         ({after:?}): unloading does not give the memory back"
    );
}
