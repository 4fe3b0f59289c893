#!/usr/bin/env python3
"""The gateway with real processes: `pagoda serve` (a real model) behind two `pagoda gateway`
instances that share one key store and, when PAGODA_TEST_REDIS is set, one Redis, driven by the
official `openai` client and by the `pagoda gateway keys|rollout|usage` commands.

Checks: chat and streaming through the gateway; a key created with the CLI on one instance
works on the other and is refused on both once revoked (openai.AuthenticationError); a
requests-per-minute limit holds across both instances (openai.RateLimitError with
Retry-After); feedback; usage per key; and a killed model server degrading to the canned reply.

Usage: gateway.py --pagoda target/debug/pagoda --model smollm2:135m
Exit status 0 when every check passed; each failure is printed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server import Child, Server, check, failures  # noqa: E402

ADMIN_KEY = "conformance-admin-key"


class Gateway(Child):
    """A `pagoda gateway` child process on an ephemeral port."""

    def __init__(self, pagoda, config_path):
        env = dict(os.environ, PAGODA_GATEWAY_ADMIN_KEY=ADMIN_KEY)
        super().__init__([pagoda, "gateway", "--config", config_path, "--listen", "127.0.0.1:0"],
                         r"listening on (http://[0-9.:]+)", "pagoda-gateway-", env=env, timeout=60)


def cli(pagoda, gateway, *args):
    env = dict(os.environ, PAGODA_GATEWAY_ADMIN_KEY=ADMIN_KEY, PAGODA_GATEWAY_URL=gateway.url)
    out = subprocess.run([pagoda, "gateway", *args], env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"pagoda gateway {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    backend = Server(args.pagoda, args.model)
    work = tempfile.mkdtemp(prefix="pagoda-gateway-conformance-")
    redis = os.environ.get("PAGODA_TEST_REDIS")
    if not redis and os.environ.get("CI") == "true":
        print("FAIL PAGODA_TEST_REDIS is not set (.ci/run starts redis-server)")
        return 1
    shared = f'[redis]\nurl = "{redis}"\nprefix = "conf-{os.getpid()}"\n' if redis else ""
    config = f"""{shared}
[[target]]
name = "smol"
model = "{args.model}"
replicas = ["{backend.url}"]

[[target]]
name = "sorry"
canned_reply = "The model is unavailable right now; please retry."

[[route]]
model = "chat"
target = "smol"
fallback = ["sorry"]
"""
    config_path = os.path.join(work, "gateway.toml")
    with open(config_path, "w") as f:
        f.write(config)
    g1 = Gateway(args.pagoda, config_path)
    g2 = Gateway(args.pagoda, config_path) if redis else g1
    try:
        key = cli(args.pagoda, g1, "keys", "create", "--name", "acme", "--models", "chat").strip()
        c1 = openai.OpenAI(base_url=g1.url + "/v1", api_key=key, max_retries=0)
        c2 = openai.OpenAI(base_url=g2.url + "/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        state = {}

        def chat():
            r = c1.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0)
            assert r.choices[0].message.content
            assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8
            state["id"] = r.id

        def stream_on_the_other_instance():
            whole = c2.chat.completions.create(model="chat", messages=messages, max_tokens=8, temperature=0,
                                               extra_headers={"x-pagoda-cache": "no-cache"})
            text = "".join(
                c.choices[0].delta.content or ""
                for c in c2.chat.completions.create(model="chat", messages=messages, max_tokens=8,
                                                    temperature=0, stream=True)
                if c.choices)
            assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)

        def models():
            assert [m.id for m in c1.models.list().data] == ["chat"]

        def unknown_model_is_404():
            try:
                c1.chat.completions.create(model="nope", messages=messages, max_tokens=4)
            except openai.NotFoundError:
                return
            raise AssertionError("no NotFoundError")

        def feedback():
            req = urllib.request.Request(
                g1.url + "/v1/feedback", method="POST",
                data=json.dumps({"response_id": state.get("id", "x"), "rating": "down"}).encode(),
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
            # No rollout on this route: the id is unknown to the rollout tracker -> 404 is correct,
            # 200 is correct too once a rollout remembers it; anything else is not.
            try:
                with urllib.request.urlopen(req) as r:
                    assert r.status == 200
            except urllib.error.HTTPError as e:
                assert e.code == 404, e.code

        def rpm_limit_across_instances():
            limited = cli(args.pagoda, g1, "keys", "create", "--name", "limited", "--rpm", "3").strip()
            ok, refused = 0, 0
            for i in range(6):
                client = openai.OpenAI(base_url=(g1 if i % 2 == 0 else g2).url + "/v1", api_key=limited,
                                       max_retries=0)
                try:
                    client.chat.completions.create(model="chat", messages=messages, max_tokens=2,
                                                   temperature=0)
                    ok += 1
                except openai.RateLimitError as e:
                    assert e.response.headers.get("retry-after"), "no Retry-After"
                    refused += 1
            assert (ok, refused) == (3, 3), (ok, refused)

        def usage_per_key():
            out = json.loads(cli(args.pagoda, g1, "usage", "--key", "acme"))
            rows = out["data"]
            assert rows and rows[0]["key_name"] == "acme" and rows[0]["total_tokens"] > 0, rows

        def revoked_everywhere():
            listing = cli(args.pagoda, g1, "keys", "list")
            assert "acme" in listing and "active" in listing, listing
            cli(args.pagoda, g1, "keys", "revoke", "acme")
            for client in (c1, c2):
                try:
                    client.chat.completions.create(model="chat", messages=messages, max_tokens=2)
                except openai.AuthenticationError:
                    continue
                raise AssertionError("a revoked key was served")

        def killed_backend_degrades_to_the_canned_reply():
            other = cli(args.pagoda, g1, "keys", "create", "--name", "after").strip()
            backend.stop()
            c = openai.OpenAI(base_url=g1.url + "/v1", api_key=other, max_retries=0)
            r = c.chat.completions.create(model="chat", messages=messages, max_tokens=4)
            assert r.choices[0].message.content.startswith("The model is unavailable"), r

        for name, fn in [("chat through the gateway", chat),
                         ("stream through the second instance", stream_on_the_other_instance),
                         ("models", models), ("unknown model is 404", unknown_model_is_404),
                         ("feedback", feedback),
                         ("rpm limit across instances", rpm_limit_across_instances),
                         ("usage per key", usage_per_key),
                         ("revoked key refused by both instances", revoked_everywhere),
                         ("killed backend -> canned reply", killed_backend_degrades_to_the_canned_reply)]:
            check(name, fn)
    finally:
        g1.stop()
        if g2 is not g1:
            g2.stop()
        backend.stop()
    if failures:
        print(f"{len(failures)} gateway check(s) failed: {', '.join(failures)}")
        return 1
    print("all gateway checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
