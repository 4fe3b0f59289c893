#!/usr/bin/env python3
"""Security probes against a real `pagoda serve` (defaults: loopback, no key) and a real
`pagoda gateway` in front of it, as an attacker on the same machine would try them.

Each probe must get its documented status, never a 5xx for a client's mistake, never a
filesystem path, an upstream URL or fetched bytes in a body, and an `x-request-id` on every
response. Web pages on other sites (cross-site simple POSTs) and DNS-rebinding Host names get
403 and change nothing. A loopback listener stands for an internal service: it must receive nothing. At the
end the server still answers a chat, and /metrics carries only the loaded model's label.

Usage: security.py --pagoda target/debug/pagoda --model smollm2:135m
Exit status 0 when every probe held; each failure is printed.
"""

import argparse
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Child, Server, check, failures  # noqa: E402

# Timeouts the servers run with here (short, so the probes are quick); the defaults are 10 s
# for headers and 30 s for bodies (docs/serving.md).
HEADER_TIMEOUT = 2
BODY_TIMEOUT = 2
# A web page on another site, and the model name its cross-site /api/copy would create.
EVIL = "https://evil.example"
STOLEN = "probe-stolen:1"


class Listener:
    """A loopback TCP listener that records every connection it gets (it must get none)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.hits = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.hits.append(peer)
            conn.close()


def request(url, method, path, body=None, headers=None):
    """(status, headers dict with lower-case names, body text) of one request."""
    host = url.split("://", 1)[1]
    conn = http.client.HTTPConnection(host, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"content-type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, text


def raw(url, chunks, pause=0.0):
    """Sends raw byte chunks with a pause after each; returns (answer, seconds until closed)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    started = time.time()
    for c in chunks:
        try:
            s.sendall(c)
        except OSError:
            break
        time.sleep(pause)
    out = b""
    while True:
        try:
            b = s.recv(4096)
        except OSError:
            break
        if not b:
            break
        out += b
    s.close()
    return out.decode("latin-1"), time.time() - started


def clean(text, store_root, extra=()):
    """Asserts a body names no file of the server and quotes no fetched bytes."""
    for bad in [store_root, "/blobs/", "sha256-", "AWS_SECR", *extra]:
        assert bad not in text, f"{bad!r} in {text[:300]!r}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    blob = subprocess.run([args.pagoda, "show", "--path", args.model], capture_output=True,
                          text=True, check=True).stdout.strip()
    store_root = blob.split("/blobs/")[0]
    secret_dir = tempfile.mkdtemp(prefix="pagoda-secret-")
    secret = os.path.join(secret_dir, "credentials")
    with open(secret, "w") as f:
        f.write("AWS_SECRET_ACCESS_KEY=do-not-leak\n")
    listener = Listener()
    timeouts = ["--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT)]
    server = Server(args.pagoda, args.model, *timeouts)
    chat = lambda model: {"model": model, "messages": [{"role": "user", "content": "hi"}],  # noqa: E731
                          "max_tokens": 4}
    try:
        def model_names_that_are_paths_are_404_alike():
            bodies = set()
            probes = ["/etc/passwd", "/root", "../../../../etc/passwd", secret, blob,
                      blob.replace("/blobs/", "/blobs/../blobs/"), "/" + blob, secret_dir,
                      "file:///etc/passwd", f"http://127.0.0.1:{listener.port}/m.gguf",
                      "hf://owner/repo/m.gguf", "/nonexistent/m.gguf"]
            for p in probes:
                for route in ("/v1/chat/completions", "/api/chat", "/v1/completions", "/api/show",
                              "/v1/embeddings"):
                    # Each route's own fields: the generation routes refuse unknown ones.
                    body = {"/v1/chat/completions": chat(p),
                            "/api/chat": {"model": p, "messages": [{"role": "user", "content": "hi"}],
                                          "options": {"num_predict": 4}},
                            "/v1/completions": {"model": p, "prompt": "x", "max_tokens": 4},
                            "/api/show": {"model": p},
                            "/v1/embeddings": {"model": p, "input": "x"}}[route]
                    status, headers, text = request(server.url, "POST", route, body)
                    assert status == 404, (p, route, status, text)
                    assert "x-request-id" in headers, (p, route)
                    clean(text.replace(p, "NAME"), store_root, ["do-not-leak"])
                    msg = json.loads(text)["error"]
                    msg = msg["message"] if isinstance(msg, dict) else msg
                    bodies.add((route, msg.replace(p, "NAME")))
            # One body per route, whatever the path: no existence oracle.
            assert len(bodies) == 5, bodies

        def pulls_are_off():
            for name in [f"http://127.0.0.1:{listener.port}/m.gguf", "file://" + secret, secret,
                         args.model]:
                status, headers, text = request(server.url, "POST", "/api/pull",
                                                {"model": name, "stream": False})
                assert status == 403, (name, status, text)
                assert "x-request-id" in headers
                assert "error" in json.loads(text), text

        def stalled_headers_get_408():
            answer, took = raw(server.url, [b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"])
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            assert "x-request-id:" in answer.lower(), answer[:300]
            assert took < HEADER_TIMEOUT + 3, took

        def stalled_body_gets_408():
            answer, took = raw(server.url, [b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
                                            b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{\"m"])
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            assert took < BODY_TIMEOUT + 3, took

        def trickled_body_gets_408():
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
                    b"content-type: application/json\r\ncontent-length: 60\r\n\r\n")
            answer, took = raw(server.url, [head] + [b" "] * 60, pause=0.25)
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            assert took < BODY_TIMEOUT + 5, took

        def idle_connection_is_closed():
            answer, took = raw(server.url, [])
            assert answer == "", answer[:200]
            assert took < HEADER_TIMEOUT + 3, took

        def deep_nesting_is_400():
            deep = ('{"model": "%s", "messages": [{"role": "user", "content": "x"}], "x": %s%s}'
                    % (args.model, "[" * 100000, "]" * 100000)).encode()
            status, headers, text = request(server.url, "POST", "/v1/chat/completions", deep)
            assert status == 400, (status, text[:200])
            assert json.loads(text)["error"]["code"] == "too_deep", text
            status, _, text = request(server.url, "POST", "/api/chat", deep)
            assert status == 400 and isinstance(json.loads(text)["error"], str), (status, text[:200])

        def bad_tools_are_refused_naming_the_field():
            body = chat(args.model)
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": []}}]
            status, _, text = request(server.url, "POST", "/v1/chat/completions", body)
            assert status == 400 and json.loads(text)["error"]["param"] == "tools", (status, text)

        def unknown_routes_answer_in_each_apis_shape():
            status, headers, text = request(server.url, "GET", "/api/nothing")
            assert status == 404 and isinstance(json.loads(text)["error"], str), text
            status, headers, text = request(server.url, "GET", "/v1/nothing")
            assert status == 404 and isinstance(json.loads(text)["error"], dict), text
            assert "x-request-id" in headers

        def still_serving_with_only_loaded_labels():
            status, headers, text = request(server.url, "POST", "/v1/chat/completions", chat(args.model))
            assert status == 200, (status, text)
            assert headers.get("x-request-id"), headers
            _, _, metrics = request(server.url, "GET", "/metrics")
            labels = set(re.findall(r'model_name="([^"]*)"', metrics))
            assert labels == {args.model}, labels

        def model_names():
            _, _, text = request(server.url, "GET", "/api/tags")
            return sorted(m["name"] for m in json.loads(text)["models"])

        def cross_site_simple_posts_are_refused():
            # A page on another site may POST text/plain or a form without a preflight.
            before = model_names()
            copy = {"source": args.model, "destination": STOLEN}
            generate = {"model": args.model, "prompt": "hi", "stream": False,
                        "options": {"num_predict": 4}}
            for ctype in ("text/plain", "application/x-www-form-urlencoded"):
                for route, body in [("/api/copy", copy), ("/v1/chat/completions", chat(args.model)),
                                    ("/api/generate", generate)]:
                    status, headers, text = request(server.url, "POST", route, json.dumps(body).encode(),
                                                    {"content-type": ctype, "origin": EVIL})
                    assert status == 403, (ctype, route, status, text[:200])
                    assert "x-request-id" in headers and "access-control-allow-origin" not in headers
                    err = json.loads(text)["error"]
                    if route.startswith("/api/"):
                        assert isinstance(err, str) and "--allowed-origins" in err, text
                    else:
                        assert err["code"] == "origin_not_allowed" and "--allowed-origins" in err["message"], text
            assert model_names() == before, (before, model_names())
            listed = subprocess.run([args.pagoda, "list"], capture_output=True, text=True, check=True).stdout
            assert STOLEN.split(":")[0] not in listed, listed

        def rebinding_hosts_are_refused():
            port = server.url.rsplit(":", 1)[1]
            for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
                for method, path in [("GET", "/api/tags"), ("GET", "/v1/models"), ("POST", "/api/generate")]:
                    body = {"model": args.model, "prompt": "hi", "stream": False} if method == "POST" else None
                    status, headers, text = request(server.url, method, path, body, {"host": host})
                    assert status == 403, (host, path, status, text[:200])
                    err = json.loads(text)["error"]
                    assert "--allowed-hosts" in (err if isinstance(err, str) else err["message"]), text
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
                status, _, text = request(server.url, "GET", "/api/tags", None, {"host": host})
                assert status == 200, (host, status, text[:200])

        def loopback_pages_and_preflights():
            # The chat page's own fetches (same origin), and a local dev page, are served.
            for origin in (server.url, "http://localhost:5173"):
                status, headers, text = request(server.url, "POST", "/v1/chat/completions",
                                                chat(args.model), {"origin": origin})
                assert status == 200, (origin, status, text[:200])
                assert headers.get("access-control-allow-origin") == origin, headers
            ask = {"access-control-request-method": "POST",
                   "access-control-request-headers": "content-type"}
            status, headers, _ = request(server.url, "OPTIONS", "/v1/chat/completions", None,
                                         {"origin": "http://localhost:5173", **ask})
            assert status == 204, status
            assert headers.get("access-control-allow-origin") == "http://localhost:5173", headers
            assert "POST" in headers.get("access-control-allow-methods", ""), headers
            status, headers, _ = request(server.url, "OPTIONS", "/v1/chat/completions", None,
                                         {"origin": EVIL, **ask})
            assert status == 403 and "access-control-allow-origin" not in headers, (status, headers)

        for name, fn in [("cross-site text/plain and form POSTs: 403, nothing copied",
                          cross_site_simple_posts_are_refused),
                         ("DNS-rebinding Host headers: 403", rebinding_hosts_are_refused),
                         ("same-origin and loopback pages served; preflights", loopback_pages_and_preflights),
                         ("model names that are paths or URLs: 404 alike, nothing leaked",
                          model_names_that_are_paths_are_404_alike),
                         ("POST /api/pull is off by default", pulls_are_off),
                         ("stalled headers: 408", stalled_headers_get_408),
                         ("stalled body: 408", stalled_body_gets_408),
                         ("trickled body: 408", trickled_body_gets_408),
                         ("idle keep-alive connection closed", idle_connection_is_closed),
                         ("deep JSON nesting: 400", deep_nesting_is_400),
                         ("bad tools refused naming the field", bad_tools_are_refused_naming_the_field),
                         ("unknown routes in each API's shape", unknown_routes_answer_in_each_apis_shape),
                         ("still serving; /metrics labels only the loaded model",
                          still_serving_with_only_loaded_labels)]:
            check(name, fn)
    finally:
        server.stop()
        # Only if a cross-site copy got through: keep the shared store as it was.
        subprocess.run([args.pagoda, "rm", STOLEN], capture_output=True)

    # Pulls enabled, with loopback even listed as a source: the address guard still holds.
    puller = Server(args.pagoda, args.model, "--allow-pull", "--pull-allow-source",
                    "http://127.0.0.1", *timeouts)
    try:
        def enabled_pulls_refuse_files_and_private_addresses():
            for name, want in [("file://" + secret, 400), (secret, 400), ("file:///etc/passwd", 400),
                               (f"http://127.0.0.1:{listener.port}/m.gguf", 502),
                               (f"http://localhost:{listener.port}/m.gguf", 400),
                               ("https://example.invalid/m.gguf", 400),
                               ("no-such-model:1b", 404)]:
                status, headers, text = request(puller.url, "POST", "/api/pull",
                                                {"model": name, "stream": False})
                assert status == want, (name, status, text)
                assert "x-request-id" in headers
                clean(text, store_root, ["do-not-leak", "connection refused"])

        check("enabled pulls: no file://, no private address", enabled_pulls_refuse_files_and_private_addresses)
        check("the loopback listener received nothing",
              lambda: (_ for _ in ()).throw(AssertionError(listener.hits)) if listener.hits else None)
    finally:
        puller.stop()

    def unloadable_files_are_not_stored():
        seed = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../fuzz/seeds/tiny_llama.gguf")
        with open(seed, "rb") as f:
            data = f.read()
        truncated = os.path.join(secret_dir, "truncated.gguf")
        with open(truncated, "wb") as f:
            f.write(data[: len(data) // 3])
        blobs = os.path.join(store_root, "blobs")
        before = sorted(os.listdir(blobs))
        out = subprocess.run([args.pagoda, "pull", truncated, "--name", "truncated:probe"],
                             capture_output=True, text=True)
        assert out.returncode != 0, out
        assert "cannot be loaded" in out.stderr, out.stderr
        listed = subprocess.run([args.pagoda, "list"], capture_output=True, text=True, check=True).stdout
        assert "truncated" not in listed, listed
        assert sorted(os.listdir(blobs)) == before, "a blob was left behind"

    check("pagoda pull of an unloadable file: refused, nothing stored", unloadable_files_are_not_stored)

    # The gateway in front of a server that is down: the client sees the route, not the upstream.
    work = tempfile.mkdtemp(prefix="pagoda-security-gateway-")
    dead = f"http://127.0.0.1:{listener.port + 1 if listener.port < 65535 else 1}"
    key = "sk-security-probe"
    config = f"""
[[key]]
name = "probe"
key_sha256 = "sha256:{hashlib.sha256(key.encode()).hexdigest()}"
rpm = 1

[[target]]
name = "backend"
model = "secret-backend-model"
replicas = ["{dead}"]

[[route]]
model = "chat"
target = "backend"
"""
    path = os.path.join(work, "gateway.toml")
    with open(path, "w") as f:
        f.write(config)
    gateway = Child([args.pagoda, "gateway", "--config", path, "--listen", "127.0.0.1:0"],
                    r"listening on (http://[0-9.:]+)", "pagoda-gateway-", timeout=60)
    try:
        def gateway_keeps_its_upstreams_private():
            status, headers, text = request(gateway.url, "POST", "/v1/chat/completions", chat("chat"),
                                            {"authorization": f"Bearer {key}"})
            assert status in (502, 503, 504), (status, text)
            assert "x-request-id" in headers, headers
            clean(text, store_root, [dead, "127.0.0.1", "secret-backend-model", "onnect"])

        def gateway_request_ids_on_errors():
            auth = {"authorization": f"Bearer {key}"}
            for method, route, body, headers in [("POST", "/v1/chat/completions", b"{", {}),
                                                 ("POST", "/v1/chat/completions", b"{", auth),
                                                 ("POST", "/v1/chat/completions", chat("nope"), auth),
                                                 ("GET", "/nothing", None, {})]:
                status, got, _ = request(gateway.url, method, route, body, headers)
                assert 400 <= status < 500, (route, status)
                assert "x-request-id" in got, (route, got)
            # Past the key's one request a minute: 429 with Retry-After and an id.
            status, got, _ = request(gateway.url, "POST", "/v1/chat/completions", chat("chat"), auth)
            assert status == 429, status
            assert "x-request-id" in got and "retry-after" in got, got

        check("gateway: 5xx names no upstream", gateway_keeps_its_upstreams_private)
        check("gateway: x-request-id on errors", gateway_request_ids_on_errors)
    finally:
        gateway.stop()

    if failures:
        print(f"{len(failures)} security probe(s) failed: {', '.join(failures)}")
        return 1
    print("all security probes held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
