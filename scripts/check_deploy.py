#!/usr/bin/env python3
"""Checks the production deployment artefacts in deploy/ (docs/deploy.md).

1. Prometheus: `promtool check rules`, `promtool test rules` (unit tests of every alert) and
   `promtool check config` on deploy/prometheus/.
2. Kubernetes: every manifest of deploy/k8s/ against the Kubernetes schemas
   (`kubernetes-validate --strict`, from PyPI); the kustomization lists every manifest and,
   where kubectl is installed, renders (`kubectl kustomize`) to objects that pass the schemas
   too; the gateway config inside the ConfigMap passes `pagoda gateway check`. The GPU
   overlay deploy/k8s-gpu is rendered by a small Python kustomize (the patch kinds it uses)
   and, where kubectl is installed, by `kubectl kustomize` too (the two must agree); the
   result passes the schemas and what docs/deploy.md promises of it (one GPU a pod, GPU
   nodes, `--device=cuda`, a utilization below the GPU memory alert, an HPA on the queue and
   GPU utilization whose external metrics prometheus-adapter's config publishes). The
   object-storage overlay deploy/k8s-bucket the same way (each pod pulls the served model
   from a bucket into its own volume; no shared store or pull Job).
3. Grafana: the dashboards are valid JSON with a Prometheus data source variable, and every
   query has an expression.
   The inference-extension values and HTTPRoute: the picker reads exported metrics, the pool
   and route select the server pods.
4. Metric names: every metric named in a dashboard query or a rule expression is really
   exported. It starts `pagoda serve` (smollm2:135m from the store in PAGODA_HOME) and a
   `pagoda gateway` in front of it, sends requests that make every metric appear (a cached
   answer, a stream, a fallback, a rate-limited key, a server error), scrapes both /metrics
   and fails with the list of names that neither exports. Recording rules of rules.yml and
   the names in EXTERNAL_METRICS are allowed without being exported, and so are the GPU
   gauges the server defines (crates/pagoda-server/src/gpu_metrics.rs) when the server has
   no NVML to read them from (a machine without a GPU).

Usage: python3 scripts/check_deploy.py --pagoda target/debug/pagoda
Needs: promtool (Debian's `prometheus` package), kubernetes-validate and PyYAML (pip).
Exit status 0 when everything passes, 1 with the failures listed otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
GPU_OVERLAY = DEPLOY / "k8s-gpu"
BUCKET_OVERLAY = DEPLOY / "k8s-bucket"
GPU_METRICS_SOURCE = ROOT / "crates" / "pagoda-server" / "src" / "gpu_metrics.rs"
MODEL = "smollm2:135m"

# Metrics that Prometheus itself produces for every target, not Pagoda: allowed in queries.
EXTERNAL_METRICS = {"up"}

# PromQL words that look like metric names but are not: aggregations, operators, keywords.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan",
}

FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL: {msg}", file=sys.stderr)


def step(title: str) -> None:
    print(f"== {title}", flush=True)


def run(cmd: list[str], what: str) -> bool:
    """Runs a command; records a failure with its output when it exits non-zero."""
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"{what}: `{' '.join(cmd)}` exited {p.returncode}\n{p.stdout}{p.stderr}")
        return False
    print(f"ok: {what}")
    return True


# ---------------------------------------------------------------- metric names in PromQL


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (a small PromQL scan, enough for our queries)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range and subquery durations
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # Grafana variables ($__rate_interval, ${x})
    # Label lists of by/without/on/ignoring/group_left/group_right.
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue  # a function or a keyword
        names.add(word)
    return names


def self_test_metric_names() -> None:
    """The PromQL scan on shapes the dashboards and rules use."""
    cases = {
        'histogram_quantile(0.99, sum by (le, model_name) (rate(a:b_bucket{x="}[y]"}[$__rate_interval])))': {"a:b_bucket"},
        "x_total / on () group_left () y and z offset 5m or vector(1)": {"x_total", "y", "z"},
        'sum without (instance) (max_over_time(g[30m])) > bool 0.9': {"g"},
    }
    for expr, want in cases.items():
        got = metric_names(expr)
        if got != want:
            fail(f"self-test: metric_names({expr!r}) = {sorted(got)}, want {sorted(want)}")


def rule_exprs_and_records() -> tuple[list[tuple[str, str]], set[str]]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    exprs, records = [], set()
    for g in rules["groups"]:
        for r in g["rules"]:
            name = r.get("record") or r.get("alert")
            exprs.append((f"rules.yml {name}", str(r["expr"])))
            if "record" in r:
                records.add(r["record"])
    return exprs, records


def dashboard_exprs() -> list[tuple[str, str]]:
    """Every query of every dashboard (panels, rows' nested panels, template variables)."""
    out = []
    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            fail(f"{path.name}: not valid JSON: {e}")
            continue
        for key in ("uid", "title", "panels", "templating"):
            if key not in d:
                fail(f"{path.name}: no `{key}`")
        variables = d.get("templating", {}).get("list", [])
        if not any(v.get("type") == "datasource" and v.get("query") == "prometheus" for v in variables):
            fail(f"{path.name}: no Prometheus data source variable")
        for v in variables:
            q = v.get("query")
            if v.get("type") == "query":
                q = q.get("query") if isinstance(q, dict) else q
                m = re.match(r"label_values\((.*),\s*\w+\)\s*$", q or "")
                if m:
                    out.append((f"{path.name} variable {v['name']}", m.group(1)))
        panels = list(d.get("panels", []))
        while panels:
            p = panels.pop(0)
            panels.extend(p.get("panels", []))
            if p.get("type") == "row":
                continue
            targets = p.get("targets") or []
            if not targets:
                fail(f"{path.name}: panel {p.get('title')!r} has no queries")
            for t in targets:
                expr = t.get("expr", "")
                if not expr.strip():
                    fail(f"{path.name}: panel {p.get('title')!r} query {t.get('refId')} has no expr")
                out.append((f"{path.name} panel {p.get('title')!r}", expr))
            # A latency panel shows P50, P95 and P99 together (issue 25: P95 beside the others).
            quantiles = {m.group(1) for t in targets
                         for m in [re.match(r"\s*histogram_quantile\(\s*([0-9.]+)", t.get("expr", ""))] if m}
            if quantiles & {"0.5", "0.50", "0.99"} and not {"0.5", "0.95", "0.99"} <= quantiles | (
                    {"0.5"} if "0.50" in quantiles else set()):
                fail(f"{path.name}: panel {p.get('title')!r} shows quantiles {sorted(quantiles)}, "
                     "not P50, P95 and P99")
        print(f"ok: {path.name} is a dashboard ({len(out)} queries so far)")
    return out


# ---------------------------------------------------------------- running pagoda


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None,
         timeout: float = 120) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start(cmd: list[str], env: dict, pattern: str, log: Path) -> tuple[subprocess.Popen, str]:
    """Starts a process and waits for its URL on stderr (lines are also copied to `log`)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        with log.open("w") as f:
            for line in p.stderr:
                f.write(line)
                f.flush()
                m = re.search(pattern, line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(180)
    if not found:
        p.kill()
        raise RuntimeError(f"`{' '.join(cmd)}` printed no URL; its log:\n{log.read_text()}")
    return p, found[0]


def wait_ready(url: str) -> None:
    for _ in range(300):
        try:
            if http("GET", url + "/ready", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/ready never answered 200")


def scrape(url: str) -> set[str]:
    status, body = http("GET", url + "/metrics")
    if status != 200:
        raise RuntimeError(f"{url}/metrics answered {status}")
    names = set()
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def exported_metrics(pagoda: str, work: Path) -> set[str]:
    env = dict(os.environ)
    env.setdefault("PAGODA_HOME", str(ROOT / "target" / "test-store"))
    procs: list[subprocess.Popen] = []
    try:
        server, surl = start([pagoda, "serve", "--model", MODEL, "--port", "0"], env,
                             r"on (http://127\.0\.0\.1:\d+)", work / "serve.log")
        procs.append(server)
        wait_ready(surl)
        with socket.socket() as sock:  # a port nothing listens on: the "dead" replica
            sock.bind(("127.0.0.1", 0))
            dead_port = sock.getsockname()[1]
        key = "pk-check-deploy-0123456789"
        digest = subprocess.run([pagoda, "gateway", "keys", "hash", key], capture_output=True,
                                text=True, check=True).stdout.strip()
        # Two targets on the same server (a canary rollout needs two), a dead one that falls
        # back, and a key with a small rpm so that some requests are rate-limited.
        (work / "gateway.toml").write_text(f"""
[server]
admin_key_env = "PAGODA_GATEWAY_ADMIN_KEY"
[storage]
sqlite = "gateway.db"
[cache]
enabled = true
backend = "memory"
[retry]
max_attempts = 2
[health]
interval_ms = 60000
[[target]]
name = "stable"
model = "{MODEL}"
replicas = ["{surl}"]
[[target]]
name = "next"
model = "{MODEL}"
replicas = ["{surl}"]
[[target]]
name = "dead"
model = "{MODEL}"
replicas = ["http://127.0.0.1:{dead_port}"]
[[route]]
model = "chat"
target = "stable"
[route.rollout]
stable = "stable"
canary = "next"
steps = [50, 100]
[[route]]
model = "fallback"
target = "dead"
fallback = ["stable"]
[[key]]
name = "check"
key_sha256 = "{digest}"
rpm = 5
""")
        genv = dict(env, PAGODA_GATEWAY_ADMIN_KEY="admin-check-deploy")
        gateway, gurl = start([pagoda, "gateway", "--config", str(work / "gateway.toml"),
                               "--listen", "127.0.0.1:0"], genv,
                              r"listening on (http://127\.0\.0\.1:\d+)", work / "gateway.log")
        procs.append(gateway)
        wait_ready(gurl)

        auth = {"authorization": f"Bearer {key}"}
        # Longer than one 64-character block, so prefix-aware routing (the default) counts it.
        msg = [{"role": "user", "content": "Say hello. Answer in one short sentence, in plain "
                "English, with no preamble."}]
        fixed = {"model": "chat", "messages": msg, "max_tokens": 4, "temperature": 0}
        sent = [
            http("POST", gurl + "/v1/chat/completions", fixed, auth),  # cache miss
            http("POST", gurl + "/v1/chat/completions", fixed, auth),  # cache hit
            http("POST", gurl + "/v1/chat/completions",  # a stream (TTFT), not cacheable
                 {**fixed, "temperature": 1.0, "stream": True}, auth),
            http("POST", gurl + "/v1/chat/completions", {**fixed, "model": "fallback"}, auth),
        ]
        for i, (status, body) in enumerate(sent):
            if status != 200:
                raise RuntimeError(f"gateway request {i} answered {status}: {body[:300]!r}")
        for _ in range(3):  # over the key's 5 requests per minute: 429
            http("POST", gurl + "/v1/chat/completions", fixed, auth)
        # A server-side error response: an unknown model.
        http("POST", surl + "/v1/chat/completions", {**fixed, "model": "no-such-model"})
        return scrape(surl) | scrape(gurl)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


# ---------------------------------------------------------------- the checks


def check_prometheus() -> None:
    step("Prometheus rules and config (promtool)")
    if not shutil.which("promtool"):
        fail("promtool not found: apt-get install prometheus")
        return
    prom = "deploy/prometheus"
    run(["promtool", "check", "rules", f"{prom}/rules.yml"], "rules are valid")
    tests = sorted(str(p.relative_to(ROOT)) for p in (DEPLOY / "prometheus" / "tests").glob("*.yml"))
    run(["promtool", "test", "rules", *tests], "alert unit tests pass")
    run(["promtool", "check", "config", f"{prom}/prometheus.yml"], "scrape config is valid")
    # Every alert has a test that expects it to fire and one that expects it not to.
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    fired, quiet = set(), set()
    for t in tests:
        for case in yaml.safe_load((ROOT / t).read_text())["tests"]:
            for a in case.get("alert_rule_test", []):
                (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    for a in sorted(alerts - fired):
        fail(f"alert {a} has no test where it fires")
    for a in sorted(alerts - quiet):
        fail(f"alert {a} has no test where it does not fire")
    if alerts <= fired and alerts <= quiet:
        print(f"ok: all {len(alerts)} alerts are tested firing and not firing")
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "adapter-config.yaml").read_text())
    if not cfg.get("externalRules"):
        fail("adapter-config.yaml has no externalRules")


def kubernetes_validate() -> list[str] | None:
    """The validator's command: its script, else the module (a pip install off PATH)."""
    if shutil.which("kubernetes-validate"):
        return [shutil.which("kubernetes-validate")]
    if importlib.util.find_spec("kubernetes_validate") is None:
        return None
    return [sys.executable, "-m", "kubernetes_validate"]


def quantity_bytes(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for u, f in units.items():
        if q.endswith(u):
            return int(float(q[: -len(u)]) * f)
    return int(q)


def check_server_deployment(docs) -> None:
    """What docs/deploy.md promises of the server pods, and the memory alert's threshold."""
    dep = next(d for d in docs if d and d["kind"] == "Deployment")
    c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "pagoda")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready":
        fail("server.yaml: the readiness probe is not GET /ready")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
        fail("server.yaml: the liveness probe is not GET /health")
    limit = quantity_bytes(c["resources"]["limits"]["memory"])
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    const = next(r["expr"] for g in rules["groups"] for r in g["rules"]
                 if r.get("record") == "pagoda:server_memory_limit_bytes")
    m = re.fullmatch(r"\s*vector\(([0-9.e+]+)\)\s*", str(const))
    if not m or int(float(m.group(1))) != limit:
        fail(f"rules.yml pagoda:server_memory_limit_bytes ({const}) is not the server "
             f"container's memory limit ({limit} bytes)")
    else:
        print("ok: server probes are /ready and /health; the memory alert's limit is the container's")


def check_kubernetes(pagoda: str, work: Path) -> None:
    step("Kubernetes manifests (kubernetes-validate --strict)")
    k8s = DEPLOY / "k8s"
    manifests = sorted(p.name for p in k8s.glob("*.yaml") if p.name != "kustomization.yaml")
    listed = yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]
    if sorted(listed) != manifests:
        fail(f"kustomization.yaml lists {sorted(listed)}, the folder has {manifests}")
    validator = kubernetes_validate()
    if not validator:
        fail("kubernetes-validate not found: pip install kubernetes-validate")
    else:
        run([*validator, "--strict", "--quiet", *[f"deploy/k8s/{m}" for m in manifests]],
            "manifests match the Kubernetes schemas")
    # The whole kustomization as `kubectl apply -k` would send it (with the generated Secret),
    # where kubectl is installed; kustomize only reads files inside its folder, so a copy.
    kubectl = shutil.which("kubectl")
    if kubectl and validator:
        copy = work / "k8s"
        shutil.copytree(k8s, copy)
        (copy / "admin-key.txt").write_text("check-deploy-admin-key")
        p = subprocess.run([kubectl, "kustomize", str(copy)], capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"`kubectl kustomize deploy/k8s` failed:\n{p.stderr}")
        else:
            (work / "rendered.yaml").write_text(p.stdout)
            kinds = sorted({d["kind"] for d in yaml.safe_load_all(p.stdout) if d})
            if "Secret" not in kinds:
                fail(f"the kustomization renders no Secret (kinds: {kinds})")
            run([*validator, "--strict", "--quiet", str(work / "rendered.yaml")],
                f"`kubectl kustomize` output matches the schemas ({', '.join(kinds)})")
    else:
        print("skipped: kubectl not installed, the kustomization itself is not rendered")
    check_server_deployment(yaml.safe_load_all((k8s / "server.yaml").read_text()))
    check_gpu_overlay(validator, work)
    check_bucket_overlay(validator, work)
    for m in manifests:
        for doc in yaml.safe_load_all((k8s / m).read_text()):
            if doc and doc.get("kind") == "ConfigMap" and "gateway.toml" in doc.get("data", {}):
                path = work / "k8s-gateway.toml"
                path.write_text(doc["data"]["gateway.toml"])
                run([pagoda, "gateway", "check", "--config", str(path)],
                    f"the gateway config in {m} is valid")


# ---------------------------------------------------------------- the GPU overlay


def merge_strategic(base, patch):
    """Kustomize's strategic merge for the shapes our patches use: maps merge key by key,
    lists of maps with a `name` merge item by name, any other list or value replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge_strategic(base[k], v) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        # Items new to the list go first, as kustomize orders them.
        out = [dict(x) for x in base]
        new = []
        for item in patch:
            i = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
            if i is None:
                new.append(item)
            else:
                out[i] = merge_strategic(out[i], item)
        return new + out
    return patch


def apply_json6902(doc, ops, where: str):
    """RFC 6902 `replace` and `add` (the ops the overlay uses); others are refused."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "replace":
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            else:
                if last not in parent:
                    raise ValueError(f"{where}: replace of a missing {op['path']}")
                parent[last] = op["value"]
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        else:
            raise ValueError(f"{where}: op {op['op']!r} not supported by this renderer")
    return doc


def render_in_python(folder: Path) -> list[dict]:
    """A kustomization's objects (resources: files or folders; patches: strategic merge,
    `$patch: delete`, or JSON 6902 with a target), without generators: enough for the
    overlays."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for r in k.get("resources", []):
        path = (folder / r).resolve()
        if path.is_dir():
            docs.extend(render_in_python(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    if k.get("namespace"):
        for d in docs:
            if d["kind"] != "Namespace":
                d.setdefault("metadata", {})["namespace"] = k["namespace"]
    for patch in k.get("patches", []):
        text = (folder / patch["path"]).read_text()
        body = yaml.safe_load(text)
        target = patch.get("target")
        if isinstance(body, list):  # JSON 6902: needs a target
            if not target:
                raise ValueError(f"{patch['path']}: a JSON 6902 patch needs a target")
            hits = [d for d in docs if d["kind"] == target["kind"]
                    and d["metadata"]["name"] == target["name"]]
            if len(hits) != 1:
                raise ValueError(f"{patch['path']}: target matches {len(hits)} objects")
            apply_json6902(hits[0], body, patch["path"])
        else:
            kind, name = body["kind"], body["metadata"]["name"]
            i = next((i for i, d in enumerate(docs)
                      if d["kind"] == kind and d["metadata"]["name"] == name), None)
            if i is None:
                raise ValueError(f"{patch['path']}: no {kind} {name} in the base")
            if body.get("$patch") == "delete":
                del docs[i]
            else:
                docs[i] = merge_strategic(docs[i], body)
    return docs


def self_test_render() -> None:
    """The Python renderer on the merge rules it relies on."""
    base = {"a": {"b": 1, "l": [{"name": "x", "v": 1}, {"name": "y"}]}, "s": [1, 2]}
    got = merge_strategic(base, {"a": {"c": 2, "l": [{"name": "x", "w": 2}]}, "s": [3]})
    want = {"a": {"b": 1, "c": 2, "l": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]}, "s": [3]}
    if merge_strategic([{"name": "a"}], [{"name": "b"}]) != [{"name": "b"}, {"name": "a"}]:
        fail("self-test: merge_strategic does not put new list items first")
    if got != want:
        fail(f"self-test: merge_strategic gave {got}, want {want}")
    doc = {"spec": {"c": [{"args": ["a"]}]}}
    apply_json6902(doc, [{"op": "replace", "path": "/spec/c/0/args", "value": ["b"]}], "self-test")
    if doc != {"spec": {"c": [{"args": ["b"]}]}}:
        fail(f"self-test: apply_json6902 gave {doc}")


def find(docs: list[dict], kind: str, name: str) -> dict | None:
    return next((d for d in docs if d and d["kind"] == kind and d["metadata"]["name"] == name), None)


def gpu_alert_threshold() -> float | None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    expr = next((str(r["expr"]) for g in rules["groups"] for r in g["rules"]
                 if r.get("alert") == "PagodaGPUMemoryHigh"), "")
    m = re.search(r">\s*([0-9.]+)\s*$", expr.strip())
    return float(m.group(1)) if m else None


def adapter_external_metrics() -> set[str]:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "adapter-config.yaml").read_text())
    return {r["name"]["as"] for r in cfg.get("externalRules") or []}


def check_gpu_overlay_objects(docs: list[dict]) -> None:
    """What docs/deploy.md promises of the GPU overlay."""
    failures_before = len(FAILURES)
    dep = find(docs, "Deployment", "pagoda-server")
    hpa = find(docs, "HorizontalPodAutoscaler", "pagoda-server")
    if not dep or not hpa:
        fail("k8s-gpu: no pagoda-server Deployment or HorizontalPodAutoscaler")
        return
    pod = dep["spec"]["template"]["spec"]
    c = next((c for c in pod["containers"] if c["name"] == "pagoda"), None)
    if c is None:
        fail("k8s-gpu: no `pagoda` container")
        return
    res = c.get("resources", {})
    for part in ("requests", "limits"):
        if str(res.get(part, {}).get("nvidia.com/gpu")) != "1":
            fail(f"k8s-gpu: the server container's resources.{part} has no nvidia.com/gpu: 1")
    if not pod.get("nodeSelector"):
        fail("k8s-gpu: no nodeSelector for GPU nodes")
    if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
        fail("k8s-gpu: no toleration of the nvidia.com/gpu taint")
    args = c.get("args", [])
    if "--device=cuda" not in args:
        fail(f"k8s-gpu: the server's args have no --device=cuda: {args}")
    if any(a.startswith("--kv-cache-memory") for a in args):
        fail("k8s-gpu: --kv-cache-memory would override --gpu-memory-utilization on a GPU")
    util = next((float(a.split("=", 1)[1]) for a in args
                 if a.startswith("--gpu-memory-utilization=")), 0.9)
    threshold = gpu_alert_threshold()
    if threshold is None:
        fail("rules.yml: no PagodaGPUMemoryHigh alert with a `> threshold` expression")
    elif util >= threshold:
        fail(f"k8s-gpu: --gpu-memory-utilization {util} is not below PagodaGPUMemoryHigh's "
             f"{threshold}: the alert would fire on every healthy GPU pod")
    external = {m["external"]["metric"]["name"] for m in hpa["spec"].get("metrics", [])
                if m.get("type") == "External"}
    for want in ("pagoda_num_requests_waiting", "pagoda_gpu_utilization_perc"):
        if want not in external:
            fail(f"k8s-gpu: the HPA does not scale on {want}")
    unpublished = external - adapter_external_metrics()
    if unpublished:
        fail(f"k8s-gpu: the HPA reads {sorted(unpublished)}, which adapter-config.yaml does "
             "not publish")
    if len(FAILURES) == failures_before:
        print(f"ok: k8s-gpu asks one GPU a pod on GPU nodes, --device=cuda, utilization {util} "
              f"below the {threshold} alert, HPA on {sorted(external)}")


def check_gpu_overlay(validator: list[str] | None, work: Path) -> None:
    step("Kubernetes GPU overlay (deploy/k8s-gpu)")
    self_test_render()
    check_overlay(GPU_OVERLAY, check_gpu_overlay_objects, validator, work,
                  compare=("Deployment", "HorizontalPodAutoscaler"))


def check_bucket_overlay_objects(docs: list[dict]) -> None:
    """What docs/deploy.md promises of the object-storage overlay."""
    failures_before = len(FAILURES)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for gone in (("PersistentVolumeClaim", "pagoda-models"), ("Job", "pagoda-pull")):
        if gone in kinds:
            fail(f"k8s-bucket: still has the shared store's {gone[0]} {gone[1]}")
    dep = find(docs, "Deployment", "pagoda-server")
    if not dep:
        fail("k8s-bucket: no pagoda-server Deployment")
        return
    pod = dep["spec"]["template"]["spec"]
    init = pod.get("initContainers") or [{}]
    cmd = init[0].get("command", [])
    if cmd[:2] != ["pagoda", "pull"] or not any(str(a).startswith(("s3://", "gs://", "az://")) for a in cmd):
        fail(f"k8s-bucket: the first init container does not pull from a bucket: {cmd}")
    served = next((a.split("=", 1)[1] for c in pod["containers"] for a in c.get("args", [])
                   if a.startswith("--model=")), None)
    if served is not None and served not in cmd:
        fail(f"k8s-bucket: the pull stores the model under another name than --model={served}: {cmd}")
    models = next((v for v in pod.get("volumes", []) if v["name"] == "models"), {})
    if "emptyDir" not in models or "persistentVolumeClaim" in models:
        fail(f"k8s-bucket: the models volume is not the pod's own emptyDir: {models}")
    if len(FAILURES) == failures_before:
        print("ok: k8s-bucket pulls the served model from a bucket into each pod's own volume; "
              "no shared store or pull Job")


def check_bucket_overlay(validator: list[str] | None, work: Path) -> None:
    step("Kubernetes object-storage overlay (deploy/k8s-bucket)")
    check_overlay(BUCKET_OVERLAY, check_bucket_overlay_objects, validator, work,
                  compare=("Deployment",))


def check_overlay(folder: Path, check_objects, validator: list[str] | None, work: Path,
                  compare: tuple[str, ...]) -> None:
    """An overlay of deploy/k8s rendered in Python (and by kubectl where installed, the two
    compared on `compare`'s pagoda-server objects), checked against the schemas and by
    `check_objects`."""
    name = folder.name
    try:
        docs = render_in_python(folder)
    except (ValueError, KeyError, IndexError, OSError) as e:
        fail(f"{name}: rendering in Python failed: {e}")
        return
    rendered = work / f"{name}-python.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    if validator:
        run([*validator, "--strict", "--quiet", str(rendered)],
            f"the overlay {name} (Python render: {len(docs)} objects) matches the schemas")
    check_objects(docs)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print(f"skipped: kubectl not installed, the overlay {name} is rendered in Python only")
        return
    # kustomize reads only inside its folders: copies of base and overlay, side by side.
    copy = work / f"{name}-tree"
    shutil.copytree(DEPLOY / "k8s", copy / "k8s")
    shutil.copytree(folder, copy / name)
    (copy / "k8s" / "admin-key.txt").write_text("check-deploy-admin-key")
    p = subprocess.run([kubectl, "kustomize", str(copy / name)], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"`kubectl kustomize deploy/{name}` failed:\n{p.stderr}")
        return
    (work / f"{name}.yaml").write_text(p.stdout)
    kdocs = [d for d in yaml.safe_load_all(p.stdout) if d]
    if validator:
        run([*validator, "--strict", "--quiet", str(work / f"{name}.yaml")],
            f"`kubectl kustomize deploy/{name}` output matches the schemas")
    check_objects(kdocs)
    # The Python renderer must say what kustomize says, or its checks mean nothing.
    for kind in compare:
        ours, theirs = find(docs, kind, "pagoda-server"), find(kdocs, kind, "pagoda-server")
        if ours is None or theirs is None or ours["spec"] != theirs["spec"]:
            fail(f"{name}: the Python render of the {kind} differs from kubectl kustomize's")
        else:
            print(f"ok: the Python render of the {kind} equals kubectl kustomize's")


def gpu_metric_names() -> set[str]:
    """The GPU gauges the server defines (string literals in gpu_metrics.rs outside tests)."""
    text = GPU_METRICS_SOURCE.read_text().split("#[cfg(test)]")[0]
    return set(re.findall(r'"(pagoda:gpu_[a-z_]+)"', text))


def check_metric_names(pagoda: str, work: Path) -> None:
    step("Grafana dashboards")
    self_test_metric_names()
    queries = dashboard_exprs()
    rule_queries, records = rule_exprs_and_records()
    referenced: dict[str, list[str]] = {}
    for where, expr in queries + rule_queries:
        for name in metric_names(expr):
            referenced.setdefault(name, []).append(where)
    step("metric names against a running pagoda serve and pagoda gateway")
    exported = exported_metrics(pagoda, work)
    gpu = gpu_metric_names()
    if len(gpu) != 3:
        fail(f"{GPU_METRICS_SOURCE.name} defines {sorted(gpu)}, not the three GPU gauges")
    # Exported only where NVML loads; on a machine without a GPU, their definition stands in.
    gpu_absent = gpu - exported

    def unexported(refs: dict[str, list[str]]) -> dict[str, list[str]]:
        return {n: w for n, w in refs.items()
                if n not in exported and n not in records and n not in EXTERNAL_METRICS
                and n not in gpu_absent}

    # Self-test: a made-up name in a query must be caught, a recording rule must not.
    probe = {n: ["self-test"] for n in metric_names(
        'sum(rate(pagoda:made_up_metric_total[5m])) / on () group_left () pagoda:sla_ttft_p99_seconds')}
    if set(unexported(probe)) != {"pagoda:made_up_metric_total"}:
        fail(f"self-test: the name check flags {sorted(unexported(probe))} in a probe query")
    missing = unexported(referenced)
    for name in sorted(missing):
        places = sorted(set(missing[name]))
        fail(f"metric {name} is not exported by pagoda serve or pagoda gateway; used in: "
             + "; ".join(places))
    if not missing:
        print(f"ok: all {len(referenced)} metric names used are exported "
              f"(or are recording rules / {sorted(EXTERNAL_METRICS)})")
    if gpu_absent:
        print(f"note: {sorted(gpu_absent)} not exported here (no NVML: no GPU); checked "
              f"against their definition in {GPU_METRICS_SOURCE.relative_to(ROOT)}")
    check_inference_extension(exported)


def check_inference_extension(exported: set[str]) -> None:
    """deploy/inference-extension: the endpoint picker reads metrics the server exports, the
    pool selects the server pods on their port, and the HTTPRoute sends to that pool."""
    step("Gateway API Inference Extension values and route (deploy/inference-extension)")
    folder = DEPLOY / "inference-extension"
    values = yaml.safe_load((folder / "values.yaml").read_text())
    flags = values["inferenceExtension"]["flags"]
    named = {k: v for k, v in flags.items() if k.endswith("-metric")}
    for flag, name in named.items():
        if name not in exported:
            fail(f"inference-extension: --{flag} names {name}, which pagoda serve does not export")
    server = next(d for d in yaml.safe_load_all((DEPLOY / "k8s" / "server.yaml").read_text())
                  if d and d["kind"] == "Deployment")
    pod = server["spec"]["template"]
    labels = pod["metadata"]["labels"]
    selector = values["inferencePool"]["modelServers"]["matchLabels"]
    if any(labels.get(k) != v for k, v in selector.items()):
        fail(f"inference-extension: the pool selects {selector}; the server pods are {labels}")
    ports = {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    wanted = {p["number"] for p in values["inferencePool"]["targetPorts"]}
    if not wanted <= ports or values["inferencePool"].get("targetPortNumber") not in ports:
        fail(f"inference-extension: the pool's ports {sorted(wanted)} are not the server's {sorted(ports)}")
    route = yaml.safe_load((folder / "httproute.yaml").read_text())
    refs = [b for r in route["spec"]["rules"] for b in r["backendRefs"]]
    if not any(b.get("kind") == "InferencePool" and b.get("name") == "pagoda-pool" for b in refs):
        fail(f"inference-extension: httproute.yaml does not send to the InferencePool pagoda-pool: {refs}")
    if not FAILURES:
        print(f"ok: the picker reads {sorted(named.values())} (all exported), the pool selects "
              f"the server pods on port {sorted(wanted)}, the HTTPRoute sends to pagoda-pool")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True, help="the pagoda binary")
    args = ap.parse_args()
    pagoda = str(Path(args.pagoda).resolve())
    with tempfile.TemporaryDirectory(prefix="pagoda-check-deploy-") as tmp:
        work = Path(tmp)
        check_prometheus()
        check_kubernetes(pagoda, work)
        try:
            check_metric_names(pagoda, work)
        except RuntimeError as e:
            fail(str(e))
    if FAILURES:
        print(f"\ncheck_deploy: {len(FAILURES)} failure(s):", file=sys.stderr)
        for f in FAILURES:
            print(f"  - {f.splitlines()[0]}", file=sys.stderr)
        return 1
    print("check_deploy: all deployment checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
