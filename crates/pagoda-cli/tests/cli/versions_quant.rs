//! Issue 41, points 7 and 8 from the command line: `pagoda list --all` and `pagoda rollback`
//! (the versions a re-pulled name keeps, going back and forth, the refusals' exit code and
//! hint), and `--quantize auto` (`pagoda serve` with a memory budget that f16 does not fit
//! but Q8_0 does serves Q8_0 and says why; `pagoda run` says what it picked).

use super::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The ID `pagoda list` shows for `name` now.
fn listed_id(env: &Env, name: &str) -> String {
    let out = stdout(&env.run(&["list"]));
    out.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("{name} not listed: {out}"))
        .to_string()
}

/// `pagoda list --all`'s rows for `name`: (current?, ID).
fn versions(env: &Env, name: &str) -> Vec<(bool, String)> {
    let o = env.run(&["list", "--all"]);
    ok(&o);
    let out = stdout(&o);
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    for col in ["NAME", "ID", "SIZE", "CURRENT"] {
        assert!(header.contains(col), "{out}");
    }
    lines
        .filter(|l| l.starts_with(name))
        .map(|l| {
            let rest = l[name.len()..].trim_start();
            let current = rest.starts_with('*');
            let id = rest
                .trim_start_matches('*')
                .split_whitespace()
                .next()
                .unwrap_or("");
            (current, id.to_string())
        })
        .collect()
}

#[test]
fn list_all_and_rollback_go_back_and_forth_between_kept_versions() {
    let env = Env::new();
    let (v1, v2) = (env.gguf("one.gguf", 1), env.gguf("two.gguf", 2));
    ok(&env.run(&["pull", v1.to_str().unwrap(), "--name", "m:1"]));
    let one = listed_id(&env, "m:1");
    // Nothing to roll back to yet: exit 1, and the hint names `list --all`.
    let o = env.run(&["rollback", "m:1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no previous version"), "{}", stderr(&o));
    assert!(stderr(&o).contains("pagoda list --all"), "{}", stderr(&o));

    ok(&env.run(&["pull", v2.to_str().unwrap(), "--name", "m:1"]));
    let two = listed_id(&env, "m:1");
    assert_ne!(one, two);
    let id_of = |seed: u8| if seed == 1 { one.clone() } else { two.clone() };
    assert_eq!(
        versions(&env, "m:1"),
        vec![(true, id_of(2)), (false, id_of(1))]
    );
    // Plain `list` is unchanged: one row per name.
    assert_eq!(stdout(&env.run(&["list"])).lines().count(), 2);

    let o = env.run(&["rollback", "m:1"]);
    ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("from {} to {}", id_of(2), id_of(1))),
        "{out}"
    );
    assert_eq!(
        versions(&env, "m:1"),
        vec![(true, id_of(1)), (false, id_of(2))]
    );
    let show = stdout(&env.run(&["show", "m:1"]));
    assert!(show.contains(&id_of(1)), "{show}");

    // Back again, by an ID prefix.
    ok(&env.run(&["rollback", "m:1", "--to", &id_of(2)[..6]]));
    assert_eq!(
        versions(&env, "m:1"),
        vec![(true, id_of(2)), (false, id_of(1))]
    );

    // Refusals: an unknown name, an unknown digest; exit 1 and nothing changes.
    for (args, needle) in [
        (&["rollback", "ghost:1"][..], "not found"),
        (
            &["rollback", "m:1", "--to", "ffffffff"][..],
            "pagoda list --all",
        ),
    ] {
        let o = env.run(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(
        versions(&env, "m:1"),
        vec![(true, id_of(2)), (false, id_of(1))]
    );

    // PAGODA_KEEP_VERSIONS=1: a re-pull keeps nothing; a bad value is refused by name.
    let o = env
        .cmd()
        .env("PAGODA_KEEP_VERSIONS", "1")
        .args(["pull", v1.to_str().unwrap(), "--name", "m:1", "--force"])
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(versions(&env, "m:1"), vec![(true, id_of(1))]);
    let o = env
        .cmd()
        .env("PAGODA_KEEP_VERSIONS", "0")
        .arg("list")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("PAGODA_KEEP_VERSIONS"),
        "{}",
        stderr(&o)
    );

    // `rm` removes the name with every version: no blob is left.
    ok(&env.run(&["pull", v2.to_str().unwrap(), "--name", "m:1"]));
    ok(&env.run(&["rm", "m:1"]));
    assert_eq!(blobs(&env.store()), 0);
    let help = stdout(&env.run(&["rollback", "--help"]));
    for word in [
        "PAGODA_KEEP_VERSIONS",
        "--to",
        "/api/rollback",
        "list --all",
    ] {
        assert!(help.contains(word), "rollback --help lacks {word}:\n{help}");
    }
}

/// GET `url` as JSON, waiting up to a minute for the server to answer.
fn get_json(url: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = ureq::get(url).call() {
            return r.into_json().expect("json");
        }
        assert!(Instant::now() < deadline, "no answer from {url}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_with_quantize_auto_picks_q8_0_when_f16_does_not_fit_and_says_why() {
    use pagoda_runtime::quant_choice::{bytes_as, kv_bytes};
    let env = Env::new();
    let dir = tiny_llama_copy(&env, "tiny", |_| {});
    let source = pagoda_model::open_model(&dir).unwrap();
    let kv = kv_bytes(
        &source.config,
        Some(64),
        1,
        16,
        pagoda_model::KvDtype::F16,
        true,
    )
    .0;
    let need = |t: &str| bytes_as(&source.weights, t.parse().unwrap()) + kv;
    let budget = (need("f16") + need("q8_0")) / 2;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = env.dir.path().join("serve.log");
    let mut child = env
        .cmd()
        .args([
            "serve",
            "-m",
            dir.to_str().unwrap(),
            "--port",
            &port.to_string(),
        ])
        .args(["--quantize", "auto", "--memory-budget", &budget.to_string()])
        .args(["--max-num-seqs", "1", "--max-model-len", "64"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("serve starts");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("{base}/ready")).call().is_err() {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "not ready: {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ps = get_json(&format!("{base}/api/ps"));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        ps["models"][0]["details"]["quantization_level"], "Q8_0",
        "{ps}"
    );
    let err = fs::read_to_string(&log).unwrap();
    for part in [
        "--quantize auto",
        "picked q8_0",
        "f16 needs",
        "64 tokens x 1 sequence",
    ] {
        assert!(err.contains(part), "{part} missing from:\n{err}");
    }

    // Nothing fits: the server refuses to start, naming the sizes and the flags.
    let o = env
        .cmd()
        .args(["serve", "-m", dir.to_str().unwrap(), "--port", "0"])
        .args(["--quantize", "auto", "--memory-budget", &kv.to_string()])
        .args(["--max-num-seqs", "1", "--max-model-len", "64"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("no format fits") && err.contains("--memory-budget"),
        "{err}"
    );
}

#[test]
fn run_with_quantize_auto_says_what_it_picked() {
    let env = Env::new();
    let dir = tiny_llama_copy(&env, "tiny", |_| {});
    let o = env.run(&[
        "run",
        dir.to_str().unwrap(),
        "--raw",
        "hello",
        "--max-tokens",
        "2",
        "--quantize",
        "auto",
    ]);
    ok(&o);
    // The tiny model fits this machine's budget as stored.
    let err = stderr(&o);
    assert!(
        err.contains("--quantize auto: picked f32 (as stored)"),
        "{err}"
    );
    assert!(!stdout(&o).contains("picked"), "the note stays off stdout");
}
