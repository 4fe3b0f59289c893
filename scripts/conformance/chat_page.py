#!/usr/bin/env python3
"""The chat page (`GET /` of `pagoda serve`) in headless Chromium, driven over the Chrome
DevTools Protocol. Each check is one thing a person relies on:

- models: the server's default model is preselected; the embedding model (listed by
  /v1/models with capabilities ["embedding"]) is not offered;
- a streamed answer from the real model appears, with the tokens/s line;
- settings: temperature and max_tokens set on the page are in the request the page sends
  (read from the paused request) and the server honours them (no more tokens than asked);
- Markdown: an answer with a heading, a list and a fenced code block is rendered, the code
  block as <pre><code>; the answer is served to the page from a canned stream (CDP's
  Fetch.fulfillRequest), since a tiny model writes no reliable Markdown;
- injection: <script>, <img onerror>, <iframe> and a javascript: link in the model's text run
  nothing and leave no such element (shown as text instead);
- stop: Stop aborts the request in flight and the server stops generating: its abort count
  goes up by one, no request is left running and no token is generated afterwards
  (/metrics); the partial answer stays, marked stopped;
- storage: a reload keeps the conversations, their messages and the settings; new chat and
  delete work and last across a reload.

Usage: chat_page.py --pagoda target/debug/pagoda --model smollm2:135m [--embed-model all-minilm]
                    [--screenshots docs/img] [--chromium chromium]
With --screenshots, writes chat-page.png (light: a conversation with the real model),
chat-page-code.png (light: a rendered code block) and chat-page-dark.png there.
Needs Debian's `chromium` and the `websocket-client` package.
"""

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Server, check, failures  # noqa: E402

CHAT_URL = "*/v1/chat/completions"


class Page:
    """One page target, spoken to over CDP. Events that arrive while waiting for a call's
    answer are kept for `next_event`."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def next_event(self, method, timeout=60):
        """The params of the next `method` event (CDP sends events only for enabled domains)."""
        deadline = time.time() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev["method"] == method:
                    return self.events.pop(i)["params"]
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"no {method} event in {timeout} s")
            self.ws.settimeout(left)
            try:
                msg = json.loads(self.ws.recv())
            finally:
                self.ws.settimeout(30)
            if "method" in msg:
                self.events.append(msg)

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


# ---- Canned answers (what a model could write), streamed to the page as the server would ----

MARKDOWN_ANSWER = """## Reading a file line by line

Open it with `with`, so it is closed even on an error:

```python
with open("notes.txt") as f:
    for n, line in enumerate(f, 1):
        print(n, line.rstrip())
```

- `enumerate(f, 1)` numbers the lines from 1
- `rstrip()` drops the newline

| mode | meaning |
|------|---------|
| `r`  | read    |
| `w`  | write   |
"""

INJECTION_ANSWER = """Here is some HTML:

<script>window.__pwned = "script"</script>

<img src="x" onerror="window.__pwned = 'img'">

<iframe src="javascript:window.__pwned = 'iframe'"></iframe>

Inline too: <b onmouseover="window.__pwned = 'b'">bold?</b> and a [link](javascript:window.__pwned='link').
"""


def sse_body(text, model):
    """`text` as a chat completion stream of small deltas, then usage and [DONE]."""
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    events = []
    for p in pieces:
        chunk = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 0, "model": model,
                 "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
        events.append(chunk)
    events.append({"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": len(pieces),
                                            "total_tokens": 10 + len(pieces)}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return base64.b64encode(body.encode()).decode()


# ---- Page helpers ----

def set_input(page, element_id, value):
    page.eval(f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); "
              f"e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); return true; }})()")


def submit(page, text):
    page.eval(f"document.getElementById('input').value = {json.dumps(text)};"
              "document.getElementById('form').requestSubmit(); true")


def wait_idle(page, what, timeout=180):
    page.wait_for("(() => { const s = document.getElementById('send'); return !s.hidden && !s.disabled; })()",
                  what, timeout)


def intercept(page):
    page.call("Fetch.enable", patterns=[{"urlPattern": CHAT_URL, "requestStage": "Request"}])


def paused_request(page):
    """The page's paused chat request: (request id, its JSON body)."""
    ev = page.next_event("Fetch.requestPaused")
    return ev["requestId"], json.loads(ev["request"]["postData"])


def canned_answer(page, prompt, answer, model):
    """Sends `prompt` from the page and answers it with `answer`, streamed."""
    intercept(page)
    try:
        submit(page, prompt)
        request_id, _ = paused_request(page)
        page.call("Fetch.fulfillRequest", requestId=request_id, responseCode=200,
                  responseHeaders=[{"name": "Content-Type", "value": "text/event-stream"}],
                  body=sse_body(answer, model))
    finally:
        page.call("Fetch.disable")
    wait_idle(page, "the canned answer")


def new_chat(page):
    page.eval("document.getElementById('new-chat').click(); true")
    page.wait_for("document.querySelectorAll('#log .msg').length === 0", "an empty conversation")


def conversations(page):
    return page.eval("[...document.querySelectorAll('#conversations li .open')].map(b => b.textContent)")


def messages(page):
    return page.eval("[...document.querySelectorAll('#log .msg')].map(m => [m.className, m.textContent])")


def color_scheme(page, scheme):
    page.call("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": scheme}])


def screenshot(page, path, scheme="light"):
    color_scheme(page, scheme)
    time.sleep(0.3)
    shot = page.call("Page.captureScreenshot", format="png")
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    color_scheme(page, "light")
    print(f"     wrote {path}")


# ---- The server's side, from /metrics ----

def metric(url, name, **labels):
    """The sum of the samples of `name` whose labels include `labels`."""
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pagoda", required=True)
    p.add_argument("--model", default="smollm2:135m")
    p.add_argument("--embed-model", default="all-minilm",
                   help="an embedding model in the store, which the page must not offer")
    p.add_argument("--screenshots", help="a folder to write the page's screenshots to")
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    a = p.parse_args()
    server = Server(a.pagoda, a.model, "--kv-cache-memory", "128MiB")
    proc = profile = None
    model = a.model
    try:
        proc, profile, ws_url = start_chromium(a.chromium, server.url + "/")
        page = Page(ws_url)
        page.call("Emulation.setDeviceMetricsOverride", width=1100, height=720, deviceScaleFactor=1, mobile=False)
        page.wait_for("document.readyState === 'complete' && document.querySelectorAll('#model option').length > 0",
                      "the model list")

        def models_offered():
            offered = page.eval("[...document.querySelectorAll('#model option')].map(o => o.value)")
            assert model in offered, offered
            # The server's default model is preselected (not whatever sorts first).
            selected = page.eval("document.getElementById('model').value")
            assert selected == model, (selected, offered)
            with urllib.request.urlopen(server.url + "/v1/models") as r:
                cards = {c["id"]: c for c in json.load(r)["data"]}
            # A name without a tag (all-minilm) is listed with its tag (all-minilm:l6-v2).
            embed = [i for i in cards if i == a.embed_model or ":" not in a.embed_model
                     and i.split(":")[0] == a.embed_model]
            assert embed, f"{a.embed_model} is not in the store: {sorted(cards)}"
            for i in embed:
                assert cards[i].get("capabilities") == ["embedding"], cards[i]
                assert i not in offered, offered
            assert all("completion" in cards[o].get("capabilities", ["completion"]) for o in offered), offered
        check(f"models: {model} preselected, the embedding model {a.embed_model} not offered", models_offered)

        def streamed_answer():
            submit(page, "What is the capital of France?")
            page.wait_for("document.querySelector('.msg.user') !== null", "the user message")
            wait_idle(page, "the streamed answer")
            assert page.eval("document.querySelector('.msg.error') === null"), page.eval("document.body.innerText")
            answer = page.eval("document.querySelector('.assistant').textContent")
            assert answer, "an empty answer"
            stats = page.eval("document.getElementById('stats').textContent")
            assert "tokens/s" in stats, stats
            print(f"     answer {answer!r}; {stats}")
            if a.screenshots:
                screenshot(page, os.path.join(a.screenshots, "chat-page.png"))
        check("a streamed answer from the model, with tokens/s", streamed_answer)

        def settings_reach_the_request():
            new_chat(page)
            set_input(page, "temperature", "0")
            set_input(page, "max-tokens", "5")
            intercept(page)
            try:
                submit(page, "Tell me about the sea.")
                request_id, body = paused_request(page)
                page.call("Fetch.continueRequest", requestId=request_id)
            finally:
                page.call("Fetch.disable")
            assert body.get("temperature") == 0 and body.get("max_tokens") == 5, body
            assert body.get("model") == model and body.get("stream") is True, body
            wait_idle(page, "the answer")
            stats = page.eval("document.getElementById('stats').textContent")
            tokens = int(stats.split()[0])
            assert 1 <= tokens <= 5, stats
            print(f"     request had temperature 0, max_tokens 5; the answer: {stats}")
        check("settings: temperature and max_tokens are sent and honoured", settings_reach_the_request)

        def markdown_rendered():
            new_chat(page)
            set_input(page, "temperature", "0.7")
            set_input(page, "max-tokens", "1024")
            canned_answer(page, "How do I read a file line by line in Python?", MARKDOWN_ANSWER, model)
            got = page.eval("""(() => {
                const a = [...document.querySelectorAll('.assistant')].pop();
                const code = a.querySelector('pre > code');
                return { code: code && code.textContent, lang: code && code.className,
                         h2: (a.querySelector('h2') || {}).textContent, items: a.querySelectorAll('li').length,
                         cells: a.querySelectorAll('td').length, inline: a.querySelectorAll(':not(pre) > code').length };
            })()""")
            assert got["code"] and "for n, line in enumerate(f, 1):" in got["code"], got
            assert "language-python" in (got["lang"] or ""), got
            assert got["h2"] == "Reading a file line by line", got
            assert got["items"] == 2 and got["cells"] == 4 and got["inline"] >= 4, got
            if a.screenshots:
                # The canned stream's figures mean nothing (it arrives at once).
                page.eval("document.getElementById('stats').textContent = ''; true")
                screenshot(page, os.path.join(a.screenshots, "chat-page-code.png"))
                screenshot(page, os.path.join(a.screenshots, "chat-page-dark.png"), scheme="dark")
        check("Markdown: heading, list, table and a fenced code block as <pre><code>", markdown_rendered)

        def injection_runs_nothing():
            new_chat(page)
            canned_answer(page, "Show me some HTML.", INJECTION_ANSWER, model)
            time.sleep(1)  # an image's onerror would have fired by now
            assert page.eval("window.__pwned === undefined"), page.eval("String(window.__pwned)")
            found = page.eval("""(() => {
                const a = [...document.querySelectorAll('.assistant')].pop();
                const bad = [...a.querySelectorAll('script, img, iframe, [onerror], [onmouseover]')].map(e => e.outerHTML);
                const links = [...a.querySelectorAll('a')].map(l => l.getAttribute('href')).filter(h => h && /^\\s*javascript:/i.test(h));
                return { bad, links, text: a.textContent };
            })()""")
            assert not found["bad"] and not found["links"], found
            # Shown as the text it is, not swallowed.
            assert "<script>" in found["text"] and "onerror" in found["text"], found["text"]
            # The links in the answer were the only ones that could run: hover and click them all.
            page.eval("[...document.querySelectorAll('.assistant a, .assistant b')].forEach(e => "
                      "{ e.dispatchEvent(new MouseEvent('mouseover')); }); true")
            time.sleep(0.3)
            assert page.eval("window.__pwned === undefined"), page.eval("String(window.__pwned)")
        check("injection: <script>, <img onerror>, <iframe>, javascript: links in the answer run nothing",
              injection_runs_nothing)

        def stop_cancels():
            new_chat(page)
            set_input(page, "temperature", "")
            set_input(page, "max-tokens", "3000")
            aborted = metric(server.url, "pagoda:request_success_total", finished_reason="abort")
            intercept(page)
            try:
                submit(page, "Write a very long story about a lighthouse keeper.")
                request_id, body = paused_request(page)
                # ignore_eos: the tiny model must still be generating when Stop is pressed.
                body["ignore_eos"] = True
                page.call("Fetch.continueRequest", requestId=request_id,
                          postData=base64.b64encode(json.dumps(body).encode()).decode())
            finally:
                page.call("Fetch.disable")
            page.wait_for("[...document.querySelectorAll('.assistant')].pop().textContent.length > 20",
                          "the start of the answer")
            assert metric(server.url, "pagoda:num_requests_running") == 1
            page.eval("document.getElementById('stop').click(); true")
            wait_idle(page, "the page to stop", timeout=10)
            deadline = time.time() + 10
            while time.time() < deadline:
                done = metric(server.url, "pagoda:request_success_total", finished_reason="abort") == aborted + 1
                if done and metric(server.url, "pagoda:num_requests_running") == 0:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the server did not count the request aborted, or it is still running")
            generated = metric(server.url, "pagoda:generation_tokens_total")
            time.sleep(1.5)
            after = metric(server.url, "pagoda:generation_tokens_total")
            assert after == generated, f"tokens still generated after the stop: {generated} -> {after}"
            last = page.eval("[...document.querySelectorAll('#log .msg')].pop().className")
            assert "stopped" in last, last
            partial = len(page.eval("[...document.querySelectorAll('.assistant')].pop().textContent"))
            print(f"     stopped after {partial} characters; the server counted the abort, "
                  f"0 running, generated tokens steady at {int(after)}")
        check("stop: the request is aborted and the server stops generating", stop_cancels)

        def storage_survives_reload():
            before_list = conversations(page)
            before_msgs = messages(page)
            assert len(before_list) >= 5, before_list
            page.call("Page.reload")
            page.wait_for("document.readyState === 'complete' && document.querySelectorAll('#model option').length > 0",
                          "the page after a reload")
            assert conversations(page) == before_list, (conversations(page), before_list)
            assert messages(page) == before_msgs, (messages(page), before_msgs)
            assert page.eval("document.getElementById('max-tokens').value") == "3000"
            # Another conversation: its code block is rendered again from storage.
            page.eval("[...document.querySelectorAll('#conversations li .open')]"
                      ".find(b => b.textContent.startsWith('How do I read a file')).click(); true")
            page.wait_for("document.querySelector('.assistant pre > code') !== null", "the stored code block")
            assert page.eval("window.__pwned === undefined")
            # Delete one, start a new chat: both last.
            page.eval("[...document.querySelectorAll('#conversations li')]"
                      ".find(li => li.textContent.startsWith('Show me some HTML')).querySelector('.delete').click(); true")
            new_chat(page)
            after_delete = conversations(page)
            assert len(after_delete) == len(before_list) - 1, after_delete
            assert not any(t.startswith("Show me some HTML") for t in after_delete), after_delete
            page.call("Page.reload")
            page.wait_for("document.readyState === 'complete' && document.querySelectorAll('#model option').length > 0",
                          "the page after a second reload")
            assert conversations(page) == after_delete, conversations(page)
            assert messages(page) == [], messages(page)
            print(f"     {len(before_list)} conversations kept over a reload; one deleted, {len(after_delete)} kept")
        check("storage: conversations, messages and settings survive a reload; new chat and delete",
              storage_survives_reload)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
        if profile:
            shutil.rmtree(profile, ignore_errors=True)
        server.stop()
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all chat page checks passed")


if __name__ == "__main__":
    main()
