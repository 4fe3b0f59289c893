//! Long commands say how far they are when stderr is not a terminal (issue 41, point 6): a
//! plain line per stage (`quantize: layers 1/2`), no bar and no terminal control characters,
//! and nothing of it on stdout.

use super::*;

/// Every line of `err` that starts with `prefix`, and that no control character (a bar's
/// carriage return or escape sequence) is anywhere in it.
fn progress_lines<'a>(err: &'a str, prefix: &str) -> Vec<&'a str> {
    assert!(
        !err.chars().any(|c| c == '\r' || c == '\x1b'),
        "control characters in stderr without a terminal:\n{err:?}"
    );
    err.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn quantize_and_eval_perplexity_print_a_line_per_stage_without_a_terminal() {
    let env = Env::new();
    let dir = tiny_llama_copy(&env, "tiny-progress", |_| {});
    let out = env.dir.path().join("q.gguf");
    let o = env.run(&[
        "quantize",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--method",
        "gptq",
        "--bits",
        "4",
    ]);
    ok(&o);
    let err = stderr(&o);
    // The tiny Llama has two layers: a line for each, in order.
    assert_eq!(
        progress_lines(&err, "quantize: layers"),
        ["quantize: layers 1/2", "quantize: layers 2/2"],
        "{err}"
    );
    assert!(!stdout(&o).contains("quantize: "), "progress on stdout");

    let o = env.run(&[
        "eval",
        "perplexity",
        dir.to_str().unwrap(),
        "--ctx",
        "64",
        "--stride",
        "32",
    ]);
    ok(&o);
    let err = stderr(&o);
    let lines = progress_lines(&err, "eval perplexity: windows ");
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no progress line:\n{err}"));
    let count = last.trim_start_matches("eval perplexity: windows ");
    let (done, total) = count.split_once('/').expect("done/total");
    assert_eq!(
        done, total,
        "the last line says all windows are done: {last}"
    );
    let total: usize = total.parse().expect("a window count");
    assert!(total > 1, "{last}");
    // A line per window (a small count), never more.
    assert!(lines.len() <= total, "{lines:?}");
    assert!(stdout(&o).contains("perplexity") && !stdout(&o).contains("windows 1/"));
}
