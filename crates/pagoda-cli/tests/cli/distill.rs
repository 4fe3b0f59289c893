//! `pagoda distill` through the binary on the tiny Llama (teacher) and a copy of it
//! (student).
//!
//! Invariants checked: a run writes OUT (a folder for a folder student) and its report, and
//! OUT loads in `pagoda run`; an existing OUT is kept unless `--force`; nonsense options, a
//! missing data file, a malformed line (named) and a checkpoint of another model exit 1 with
//! a message naming the problem and leave no output; `--help` explains the options.

use super::*;

fn data(env: &Env) -> PathBuf {
    let mut text = String::new();
    for line in [
        "the quick brown fox jumps over the lazy dog",
        "a stitch in time saves nine",
        "to be or not to be, that is the question",
        "all that glitters is not gold",
        "pack my box with five dozen liquor jugs",
        "the rain in spain stays mainly in the plain",
    ] {
        text.push_str(&format!("{{\"text\": \"{line}\"}}\n"));
    }
    text.push_str("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello there\"}]}\n");
    env.file("data.jsonl", text.as_bytes())
}

fn base_args(teacher: &Path, student: &Path, out: &Path, data: &Path) -> Vec<String> {
    [
        "distill",
        "--teacher",
        teacher.to_str().unwrap(),
        "--student",
        student.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "3",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--top-k",
        "8",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--held-out-fraction",
        "0.2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn refused(env: &Env, args: &[String], needle: &str, out: &Path) {
    let o = env.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(needle), "{err:?} should name {needle:?}");
    assert!(!out.exists(), "{} left behind", out.display());
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    assert!(!Path::new(&partial).exists());
}

#[test]
fn distill_trains_writes_a_model_that_runs_and_refuses_bad_input() {
    let env = Env::new();
    let teacher = tiny_llama_copy(&env, "teacher", |_| {});
    let student = tiny_llama_copy(&env, "student", |_| {});
    let data = data(&env);
    let out = env.dir.path().join("distilled");
    let args = base_args(&teacher, &student, &out, &data);
    let o = env.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    ok(&o);
    let err = stderr(&o);
    assert!(err.contains("3 steps") && err.contains("tokens/s"), "{err}");
    assert!(err.contains("held-out: perplexity"), "{err}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let report = env.dir.path().join("distilled.report.jsonl");
    assert!(fs::read_to_string(&report).unwrap().contains("\"loss\""));
    assert!(env
        .dir
        .path()
        .join("distilled.checkpoint/state.json")
        .is_file());
    ok(&env.run(&[
        "run",
        out.to_str().unwrap(),
        "--raw",
        "hello",
        "--max-tokens",
        "3",
    ]));

    // An existing OUT is kept without --force.
    let o = env.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert!(out.join("config.json").is_file());

    let out2 = env.dir.path().join("bad");
    // The base arguments with `extra`'s flags given these values instead.
    let with = |extra: &[&str]| -> Vec<String> {
        let base = base_args(&teacher, &student, &out2, &data);
        let mut a = Vec::new();
        let mut i = 0;
        while i < base.len() {
            if extra.contains(&base[i].as_str()) && base[i].starts_with("--") {
                i += 2;
                continue;
            }
            a.push(base[i].clone());
            i += 1;
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    refused(&env, &with(&["--lr", "0"]), "--lr", &out2);
    refused(&env, &with(&["--seq-len", "0"]), "--seq-len", &out2);
    refused(&env, &with(&["--top-k", "0"]), "--top-k", &out2);
    refused(&env, &with(&["--top-k", "100000"]), "--top-k", &out2);
    refused(&env, &with(&["--temperature", "0"]), "--temperature", &out2);
    refused(
        &env,
        &with(&["--hard-weight", "1.5"]),
        "--hard-weight",
        &out2,
    );
    refused(
        &env,
        &with(&["--loss", "js"]),
        "forward, reverse or skew",
        &out2,
    );
    refused(&env, &with(&["--lora-rank", "0"]), "--lora-rank", &out2);
    let mut missing = base_args(
        &teacher,
        &student,
        &out2,
        &env.dir.path().join("none.jsonl"),
    );
    missing.push("--force".into());
    refused(&env, &missing, "does not exist", &out2);
    let bad = env.file(
        "bad.jsonl",
        b"{\"text\": \"ok\"}\n{\"text\": \"ok\"}\nnot json\n",
    );
    refused(
        &env,
        &base_args(&teacher, &student, &out2, &bad),
        "bad.jsonl:3:",
        &out2,
    );
    // A checkpoint of another model.
    let qwen = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-qwen2");
    let qout = env.dir.path().join("q");
    let mut q = base_args(&qwen, &qwen, &qout, &data);
    q.extend(["--stop-after", "1"].iter().map(|s| s.to_string()));
    ok(&env.run(&q.iter().map(String::as_str).collect::<Vec<_>>()));
    let ckpt = env.dir.path().join("q.checkpoint");
    refused(
        &env,
        &with(&["--resume", ckpt.to_str().unwrap()]),
        "another student model",
        &out2,
    );
    // A tokenizer mismatch.
    refused(
        &env,
        &base_args(&qwen, &student, &out2, &data),
        "do not share a tokenizer",
        &out2,
    );

    let help = env.run(&["distill", "--help"]);
    ok(&help);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--hard-weight",
        "--top-k",
        "--lora-rank",
        "--resume",
        "--grad-accum",
    ] {
        assert!(text.contains(flag), "{flag} in --help");
    }
}
