#!/usr/bin/env python3
"""The chat page (`GET /` of `pagoda serve`) in headless Chromium, driven over the Chrome
DevTools Protocol: the page lists the model, a message is sent, the streamed answer appears
and the tokens/s line is shown.

Usage: chat_page.py --pagoda target/debug/pagoda --model smollm2:135m [--chromium chromium]
Needs Debian's `chromium` and the `websocket-client` package.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server  # noqa: E402


class Page:
    """One page target, spoken to over CDP."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expression)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")


def start_chromium(binary, url):
    profile = tempfile.mkdtemp(prefix="pagoda-chromium-")
    proc = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--remote-allow-origins=*", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while not os.path.exists(port_file) and time.time() < deadline:
        time.sleep(0.1)
    with open(port_file) as f:
        port = int(f.readline())
    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        if pages:
            return proc, profile, pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.1)
    raise RuntimeError("chromium opened no page")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", default="smollm2:135m")
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    a = p.parse_args()
    server = Server(a.pagoda, a.model, "--kv-cache-memory", "128MiB")
    proc = profile = None
    try:
        proc, profile, ws_url = start_chromium(a.chromium, server.url + "/")
        page = Page(ws_url)
        page.wait_for("document.readyState === 'complete' && document.querySelectorAll('#model option').length > 0",
                      "the model list")
        models = page.eval("[...document.querySelectorAll('#model option')].map(o => o.value)")
        assert a.model in models, models
        # The server's default model is preselected (not whatever sorts first, e.g. an
        # embedding model that cannot chat).
        selected = page.eval("document.getElementById('model').value")
        assert selected == a.model, (selected, models)
        page.eval(f"document.getElementById('model').value = {json.dumps(a.model)}")
        page.eval("document.getElementById('input').value = 'What is the capital of France?';"
                  "document.getElementById('form').requestSubmit(); true")
        page.wait_for("document.querySelector('.msg.user') !== null", "the user message")
        page.wait_for("!document.getElementById('send').disabled && "
                      "(document.querySelector('.assistant') || {textContent: ''}).textContent.length > 0",
                      "the streamed answer")
        assert page.eval("document.querySelector('.msg.error') === null"), page.eval("document.body.innerText")
        answer = page.eval("document.querySelector('.assistant').textContent")
        stats = page.eval("document.getElementById('stats').textContent")
        assert "tokens/s" in stats, stats
        print(f"ok   chat page: answer {answer!r}; {stats}")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
        if profile:
            shutil.rmtree(profile, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
