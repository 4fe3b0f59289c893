#!/usr/bin/env python3
"""The blind comparison page of `pagoda eval compare` in headless Chromium, driven over the
Chrome DevTools Protocol: a page is made for the tiny test model against itself quantized to
Q8_0, opened from file:// (no server, no network), three prompts are judged (a button click
and two keyboard shortcuts), the picks are exported with the page's own button, and
`pagoda eval winrate` reads the downloaded file against the key.

Usage: compare_page.py --pagoda target/debug/pagoda [--model tests/golden/tiny-llama]
                       [--chromium chromium]
Needs Debian's `chromium` and the `websocket-client` package (as chat_page.py).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_page import Page, start_chromium  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def key_press(page, key):
    for kind in ("keyDown", "keyUp"):
        params = {"type": kind, "key": key, "code": f"Digit{key}", "windowsVirtualKeyCode": ord(key)}
        if kind == "keyDown":
            params["text"] = key
        page.call("Input.dispatchKeyEvent", **params)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", default=os.path.join(ROOT, "tests", "golden", "tiny-llama"))
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="pagoda-compare-")
    env = dict(os.environ, PAGODA_HOME=os.path.join(work, "store"))
    proc = profile = None
    try:
        prompts = os.path.join(work, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("Hello there\n<script>window.pwned = 1</script> is this code?\nWhat is 2+2?\n")
        html = os.path.join(work, "compare.html")
        subprocess.run([a.pagoda, "eval", "compare", "--model-a", a.model, "--quantize-b", "q8_0",
                        "--prompts", prompts, "-o", html, "--max-tokens", "8", "--seed", "5"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(work, "compare.key.json")) as f:
            key = json.load(f)

        proc, profile, ws_url = start_chromium(a.chromium, "about:blank")
        page = Page(ws_url)
        downloads = os.path.join(work, "downloads")
        os.makedirs(downloads)
        page.call("Page.setDownloadBehavior", behavior="allow", downloadPath=downloads)
        page.call("Page.navigate", url="file://" + html)
        page.wait_for("document.readyState === 'complete' && window.pagodaCompare !== undefined", "the page")

        # The prompt's markup is text, not a script; the page names no variant.
        assert page.eval("document.querySelectorAll('script').length") == 1
        assert page.eval("window.pwned === undefined")
        assert "<script>window.pwned = 1</script>" in page.eval("document.body.textContent")
        body = page.eval("document.documentElement.outerHTML")
        for secret in (a.model, "q8_0", "Q8_0"):
            assert secret not in body, f"the page reveals {secret!r}"
        assert page.eval("document.getElementById('progress').textContent") == "0 of 3 judged"

        # Prompt 1: the button; prompts 2 and 3: the keys (3 = right better, 2 = tie). After
        # each pick the page moves to the next unjudged prompt.
        page.eval("document.querySelector('.item.current button[data-pick=left]').click(); true")
        page.wait_for("document.getElementById('progress').textContent === '1 of 3 judged'", "pick 1")
        key_press(page, "3")
        page.wait_for("document.getElementById('progress').textContent === '2 of 3 judged'", "pick 2")
        key_press(page, "2")
        page.wait_for("document.getElementById('progress').textContent === '3 of 3 judged'", "pick 3")

        page.eval("document.getElementById('export').click(); true")
        deadline = time.time() + 30
        files = []
        while time.time() < deadline:
            files = [f for f in glob.glob(os.path.join(downloads, "*.json"))]
            if files:
                break
            time.sleep(0.2)
        assert files, "the export button downloaded nothing"
        with open(files[0]) as f:
            picks = json.load(f)
        assert picks["compare_id"] == key["compare_id"], picks
        assert [(x["id"], x["pick"]) for x in picks["picks"]] == [("1", "left"), ("2", "right"), ("3", "tie")], picks

        out = subprocess.run([a.pagoda, "eval", "winrate", "--key", os.path.join(work, "compare.key.json"),
                              "--picks", files[0], "--json"],
                             check=True, env=env, capture_output=True, text=True).stdout
        r = json.loads(out)
        left = {i["id"]: i["left"] for i in key["items"]}
        a_wins = (left["1"] == "a") + (left["2"] == "b")
        assert (r["a_wins"], r["b_wins"], r["ties"]) == (a_wins, 2 - a_wins, 1), r
        print(f"ok   compare page: 3 picks exported; win rate of A {r['win_rate_a']:.2f} "
              f"(Wilson {r['wilson_95']['low']:.2f}-{r['wilson_95']['high']:.2f})")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
        if profile:
            shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
