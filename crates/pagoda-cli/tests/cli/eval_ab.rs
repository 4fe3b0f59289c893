//! `pagoda eval compare` / `winrate` / `report` through the binary on the tiny Llama.
//!
//! Invariants checked: the page holds every prompt and answer escaped and no trace of which
//! variant is on which side; the key undoes the shuffle; answers are what `pagoda run` gives;
//! bad input exits 1 with a message naming it and leaves no output file.

use super::*;

/// A tiny model copy, a prompt file, and the paths of the page and key.
struct Ab {
    env: Env,
    model: PathBuf,
    prompts: PathBuf,
    html: PathBuf,
    key: PathBuf,
}

fn ab() -> Ab {
    let env = Env::new();
    let model = tiny_llama_copy(&env, "tiny-ab", |_| {});
    let prompts = env.dir.path().join("prompts.jsonl");
    fs::write(
        &prompts,
        "{\"id\": \"hello\", \"prompt\": \"Hello there\"}\n\
         {\"prompt\": \"<script>alert(1)</script> & friends\"}\n\
         \n\
         {\"id\": 7, \"prompt\": \"What is 2+2?\"}\n",
    )
    .unwrap();
    let html = env.dir.path().join("out").join("compare.html");
    fs::create_dir_all(html.parent().unwrap()).unwrap();
    let key = env.dir.path().join("out").join("compare.key.json");
    Ab {
        env,
        model,
        prompts,
        html,
        key,
    }
}

impl Ab {
    fn compare(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "eval",
            "compare",
            "--model-a",
            self.model.to_str().unwrap(),
            "--quantize-b",
            "q8_0",
            "--prompts",
            self.prompts.to_str().unwrap(),
            "-o",
            self.html.to_str().unwrap(),
            "--max-tokens",
            "8",
        ];
        args.extend(extra);
        self.env.run(&args)
    }

    fn key(&self) -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(&self.key).unwrap()).unwrap()
    }

    /// Writes picks that choose `pick(variant on the left)` per item; returns the path.
    fn picks(&self, name: &str, picks: &[(&str, &str)]) -> PathBuf {
        let id = self.key()["compare_id"].as_str().unwrap().to_string();
        let picks: Vec<_> = picks
            .iter()
            .map(|(i, p)| serde_json::json!({"id": i, "pick": p}))
            .collect();
        let path = self.env.dir.path().join(name);
        let body = serde_json::json!({"version": 1, "compare_id": id, "picks": picks});
        fs::write(&path, body.to_string()).unwrap();
        path
    }

    /// The page's choice that favours `variant` ("a" or "b") on item `id`.
    fn choice_for(&self, id: &str, variant: &str) -> &'static str {
        let key = self.key();
        let item = key["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()
            .clone();
        if item["left"] == variant {
            "left"
        } else {
            "right"
        }
    }

    fn winrate(&self, picks: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "eval",
            "winrate",
            "--key",
            self.key.to_str().unwrap(),
            "--picks",
            picks.to_str().unwrap(),
        ];
        args.extend(extra);
        self.env.run(&args)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[test]
fn eval_compare_writes_a_blind_page_and_a_key() {
    let t = ab();
    let o = t.compare(&["--seed", "3"]);
    ok(&o);
    assert!(stdout(&o).contains("compare.key.json"), "{}", stdout(&o));
    let html = fs::read_to_string(&t.html).unwrap();
    let key = t.key();
    // Structure: one section per prompt, the pick buttons, progress and export.
    assert_eq!(html.matches("<section class=\"item\"").count(), 3);
    for needle in [
        "data-id=\"hello\"",
        "data-id=\"2\"",
        "data-id=\"7\"",
        "Left better",
        "Right better",
        "Tie",
        "Export picks",
        "id=\"progress\"",
    ] {
        assert!(html.contains(needle), "page lacks {needle}");
    }
    // Escaped prompt, one script element (the page's), nothing fetched from anywhere.
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; friends"));
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("src=") && !html.contains("https://"));
    // No side mapping and no variant in the page.
    let model = t.model.to_str().unwrap();
    for secret in [model, "tiny-ab", "q8_0", "Q8_0", "\"left\":", "quantize"] {
        assert!(!html.contains(secret), "page reveals {secret:?}");
    }
    assert!(html.contains(key["compare_id"].as_str().unwrap()));
    assert_eq!(key["variant_a"]["model"], model);
    assert_eq!(key["variant_b"]["quantize"], "q8_0");
    assert_eq!(key["items"].as_array().unwrap().len(), 3);
    // Variant A's answer is what `pagoda run` answers, with the same greedy settings.
    let run = t.env.run(&[
        "run",
        model,
        "What is 2+2?",
        "--temperature",
        "0",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "--repeat-penalty",
        "1",
        "--max-tokens",
        "8",
    ]);
    ok(&run);
    let answer = stdout(&run);
    let answer = answer.strip_suffix('\n').unwrap_or(&answer);
    assert!(!answer.is_empty());
    assert!(
        html.contains(&format!("class=\"answer\">{}</div>", escape(answer))),
        "the run answer {answer:?} is not on the page"
    );
    // The same seed gives the same page and key; another seed another shuffle id.
    let first_key = fs::read_to_string(&t.key).unwrap();
    ok(&t.compare(&["--seed", "3"]));
    assert_eq!(fs::read_to_string(&t.key).unwrap(), first_key);
    assert_eq!(fs::read_to_string(&t.html).unwrap(), html);
    assert!(!t.env.dir.path().join("out/compare.html.partial").exists());
}

#[test]
fn eval_winrate_counts_picks_through_the_key() {
    let t = ab();
    ok(&t.compare(&["--seed", "11"]));
    // A wins "hello", B wins "2", "7" is a tie: (1 + 0.5) / 3 = 0.5.
    let picks = t.picks(
        "picks.json",
        &[
            ("hello", t.choice_for("hello", "a")),
            ("2", t.choice_for("2", "b")),
            ("7", "tie"),
        ],
    );
    let o = t.winrate(&picks, &["--json"]);
    ok(&o);
    let r: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        (r["a_wins"].as_u64(), r["b_wins"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!((r["ties"].as_u64(), r["n"].as_u64()), (Some(1), Some(3)));
    assert_eq!(r["win_rate_a"].as_f64(), Some(0.5));
    // Wilson for 1.5 of 3, by hand: [0.125334, 0.874666].
    let (lo, hi) = (
        r["wilson_95"]["low"].as_f64().unwrap(),
        r["wilson_95"]["high"].as_f64().unwrap(),
    );
    assert!((lo - 0.125_334_471_910_263_2).abs() < 1e-9, "{lo}");
    assert!((hi - 0.874_665_528_089_736_9).abs() < 1e-9, "{hi}");
    assert_eq!(r["unjudged"].as_u64(), Some(0));
    assert_eq!(r["variant_b"]["quantize"], "q8_0");
    // The table says how ties count and which intervals these are.
    let o = t.winrate(&picks, &[]);
    ok(&o);
    let out = stdout(&o);
    for needle in ["ties count half", "Wilson", "bootstrap", "50.0%", "12.5%"] {
        assert!(out.contains(needle), "table lacks {needle}: {out}");
    }
    // All for A, one prompt unjudged.
    let picks = t.picks(
        "all-a.json",
        &[
            ("hello", t.choice_for("hello", "a")),
            ("7", t.choice_for("7", "a")),
        ],
    );
    let o = t.winrate(&picks, &["--json"]);
    ok(&o);
    let r: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(r["win_rate_a"].as_f64(), Some(1.0));
    assert_eq!(r["unjudged"].as_u64(), Some(1));
    assert_eq!(r["wilson_95"]["high"].as_f64(), Some(1.0));
}

#[test]
fn eval_compare_bad_input_is_a_clear_error_and_writes_nothing() {
    let t = ab();
    let dir = t.env.dir.path();
    let empty = dir.join("empty.txt");
    fs::write(&empty, "\n  \n").unwrap();
    let bad = dir.join("bad.jsonl");
    fs::write(&bad, "{\"prompt\": \"fine\"}\n{\"prompt\": \n").unwrap();
    let dup = dir.join("dup.jsonl");
    fs::write(
        &dup,
        "{\"prompt\": \"a\", \"id\": \"x\"}\n{\"prompt\": \"b\", \"id\": \"x\"}\n",
    )
    .unwrap();
    let model = t.model.to_str().unwrap();
    let html = t.html.to_str().unwrap();
    let missing = dir.join("missing.txt");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--prompts", missing.to_str().unwrap()],
            vec!["missing.txt"],
        ),
        (
            vec!["--prompts", empty.to_str().unwrap()],
            vec!["empty.txt", "empty"],
        ),
        (
            vec!["--prompts", bad.to_str().unwrap()],
            vec!["bad.jsonl", "line 2"],
        ),
        (
            vec!["--prompts", dup.to_str().unwrap()],
            vec!["\"x\"", "more than once"],
        ),
    ];
    for (extra, needles) in cases {
        let mut args = vec!["eval", "compare", "--model-a", model, "-o", html];
        args.extend(&extra);
        let o = t.env.run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{extra:?}: stderr lacks {n:?}: {err}");
        }
        assert!(stdout(&o).is_empty());
    }
    // A model that cannot be loaded: fails after the prompts were read, still no file.
    let o = t.env.run(&[
        "eval",
        "compare",
        "--model-a",
        model,
        "--model-b",
        dir.join("nope.gguf").to_str().unwrap(),
        "--prompts",
        t.prompts.to_str().unwrap(),
        "-o",
        html,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("variant B"), "{}", stderr(&o));
    let leftovers: Vec<_> = fs::read_dir(dir.join("out")).unwrap().collect();
    assert!(leftovers.is_empty(), "no partial output: {leftovers:?}");
}

#[test]
fn eval_winrate_refuses_picks_that_do_not_match_the_key() {
    let t = ab();
    ok(&t.compare(&[]));
    let dir = t.env.dir.path();
    let unknown = t.picks("unknown.json", &[("hello", "left"), ("nine", "right")]);
    let dup = t.picks("dup.json", &[("7", "left"), ("7", "tie")]);
    let empty = t.picks("empty.json", &[]);
    let bad_choice = t.picks("choice.json", &[("7", "both")]);
    let malformed = dir.join("malformed.json");
    fs::write(&malformed, "{\"version\": 1, \"picks\": [").unwrap();
    let other = dir.join("other.json");
    fs::write(
        &other,
        "{\"version\": 1, \"compare_id\": \"0123456789abcdef\", \"picks\": []}",
    )
    .unwrap();
    let missing = dir.join("missing.json");
    let cases: Vec<(&Path, Vec<&str>)> = vec![
        (&unknown, vec!["\"nine\"", "key does not have"]),
        (&dup, vec!["\"7\"", "more than once"]),
        (&empty, vec!["no picks"]),
        (&bad_choice, vec!["choice.json", "both"]),
        (&malformed, vec!["malformed.json", "not a picks file"]),
        (&other, vec!["wrong key"]),
        (&missing, vec!["missing.json"]),
    ];
    for (picks, needles) in cases {
        let o = t.winrate(picks, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{picks:?}: {err}");
        assert!(stdout(&o).is_empty(), "{picks:?}: {}", stdout(&o));
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{picks:?}: stderr lacks {n:?}: {err}");
        }
    }
    // A key that is not one.
    let o = t.env.run(&[
        "eval",
        "winrate",
        "--key",
        t.prompts.to_str().unwrap(),
        "--picks",
        unknown.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a compare key file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn eval_report_measures_each_variant() {
    let env = Env::new();
    let model = tiny_llama_copy(&env, "tiny-rep", |_| {});
    let m = model.to_str().unwrap();
    let gsm = env.dir.path().join("gsm.jsonl");
    fs::write(
        &gsm,
        "{\"question\": \"1+1?\", \"answer\": \"#### 2\"}\n{\"question\": \"2+2?\", \"answer\": \"#### 4\"}\n",
    )
    .unwrap();
    let (md, svg, json) = (
        env.dir.path().join("report.md"),
        env.dir.path().join("size_vs_quality.svg"),
        env.dir.path().join("report.json"),
    );
    let q8 = format!("{m}:q8_0");
    let q4 = format!("{m}:Q4_0");
    let o = env.run(&[
        "eval",
        "report",
        "--baseline",
        m,
        "--variant",
        &q8,
        "--variant",
        &q4,
        "--ppl-ctx",
        "64",
        "--mc",
        "--gsm8k",
        "2",
        "--gsm8k-file",
        gsm.to_str().unwrap(),
        "--gsm8k-max-tokens",
        "4",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--repeat",
        "1",
        "-o",
        md.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
        "--json-output",
        json.to_str().unwrap(),
        "--json",
    ]);
    ok(&o);
    // Not a terminal: a line per measurement (3 variants x speed, perplexity, mc, GSM8K).
    let err = stderr(&o);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("eval report: measurements "))
        .collect();
    assert_eq!(lines.len(), 12, "{err}");
    assert!(
        lines[0].starts_with("eval report: measurements 1/12 (speed of tiny-rep)"),
        "{err}"
    );
    assert!(
        lines[11].starts_with("eval report: measurements 12/12"),
        "{err}"
    );
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        r,
        serde_json::from_str::<serde_json::Value>(&fs::read_to_string(&json).unwrap()).unwrap()
    );
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1]["name"], "tiny-rep:q8_0");
    assert_eq!(rows[2]["quantize"], "q4_0");
    // F32 weights are 32 bits each; Q8_0 is 8.5 bits per weight on the quantized matrices.
    assert!(
        (rows[0]["bits_per_weight"].as_f64().unwrap() - 32.0).abs() < 0.01,
        "{}",
        rows[0]
    );
    assert!(rows[1]["weight_bytes"].as_u64() < rows[0]["weight_bytes"].as_u64());
    for row in rows {
        for f in [
            "peak_rss_bytes",
            "prefill_tps",
            "decode_tps",
            "perplexity",
            "mc_acc",
            "gsm8k",
        ] {
            assert!(row[f].as_f64().is_some_and(|v| v >= 0.0), "{f}: {row}");
        }
        assert!(row["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    }
    // The baseline's perplexity is what `eval perplexity` prints for it.
    let o = env.run(&["eval", "perplexity", m, "--ctx", "64", "--json"]);
    ok(&o);
    let ppl: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(rows[0]["perplexity"], ppl["perplexity"]);
    let d = &r["deltas"][1];
    let dp = d["perplexity"].as_f64().unwrap();
    let want = rows[1]["perplexity"].as_f64().unwrap() - rows[0]["perplexity"].as_f64().unwrap();
    assert!((dp - want).abs() < 1e-9);
    let table = fs::read_to_string(&md).unwrap();
    assert!(table.contains("| tiny-rep (baseline) |"), "{table}");
    assert!(
        table.contains("| tiny-rep:q4_0 |") && table.contains("gsm8k"),
        "{table}"
    );
    assert!(
        table.contains("VmHWM"),
        "the method is written down: {table}"
    );
    let plot = fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.matches("class=\"point\"").count() == 3);
    assert!(plot.contains("tiny-rep:q8_0"));
    // Title and labels inside the document, both axes ticked, labelled and titled.
    pagoda_svg::check(&plot).unwrap_or_else(|p| panic!("{p:#?}\n{plot}"));
}

#[test]
fn eval_report_bad_input_is_a_clear_error_and_writes_nothing() {
    let env = Env::new();
    let model = tiny_llama_copy(&env, "tiny-rep", |_| {});
    let m = model.to_str().unwrap();
    let out = env.dir.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let md = out.join("r.md");
    let svg = out.join("r.svg");
    let missing = env.dir.path().join("missing.txt");
    let nope = env.dir.path().join("nope.gguf");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--baseline", m, "--ppl-text", missing.to_str().unwrap()],
            vec!["--ppl-text", "missing.txt"],
        ),
        (
            vec!["--baseline", m, "--mc", missing.to_str().unwrap()],
            vec!["--mc", "missing.txt"],
        ),
        (vec!["--baseline", m, "--gsm8k", "0"], vec!["--gsm8k"]),
        (
            vec!["--baseline", m, "--prompt-tokens", "0"],
            vec!["--prompt-tokens"],
        ),
        (
            vec![
                "--baseline",
                m,
                "--variant",
                nope.to_str().unwrap(),
                "--prompt-tokens",
                "8",
                "--gen-tokens",
                "2",
            ],
            vec!["nope.gguf", "speed"],
        ),
        (
            vec!["--baseline", m, "--prompt-tokens", "1000"],
            vec!["speed", "context"],
        ),
    ];
    for (extra, needles) in cases {
        let mut args = vec![
            "eval",
            "report",
            "-o",
            md.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ];
        args.extend(&extra);
        let o = env.run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(stdout(&o).is_empty(), "{extra:?}: {}", stdout(&o));
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{extra:?}: stderr lacks {n:?}: {err}");
        }
        let leftovers: Vec<_> = fs::read_dir(&out).unwrap().collect();
        assert!(
            leftovers.is_empty(),
            "{extra:?}: no output file: {leftovers:?}"
        );
    }
}

#[test]
fn eval_compare_winrate_report_help_explain_the_method() {
    let env = Env::new();
    let help = |args: &[&str]| {
        let o = env.run(args);
        ok(&o);
        stdout(&o)
    };
    let out = help(&["eval", "compare", "--help"]);
    for word in [
        "--model-a",
        "--quantize-b",
        "--seed",
        "key",
        "pagoda run",
        "Export picks",
    ] {
        assert!(out.contains(word), "compare --help lacks {word}:\n{out}");
    }
    let out = help(&["eval", "winrate", "--help"]);
    for word in ["ties count half", "Wilson", "bootstrap", "--json"] {
        assert!(out.contains(word), "winrate --help lacks {word}:\n{out}");
    }
    let out = help(&["eval", "report", "--help"]);
    for word in ["VmHWM", "bits/weight", "MODEL:TYPE", "--plot", "--variant"] {
        assert!(out.contains(word), "report --help lacks {word}:\n{out}");
    }
}
