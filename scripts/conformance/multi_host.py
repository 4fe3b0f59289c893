#!/usr/bin/env python3
"""Many replicas as one system, each process on a host of its own: three `pagoda serve`
replicas, two `pagoda gateway` instances and one Redis, each in its own network namespace
(`ip netns`, a veth pair per namespace on one bridge; traffic never leaves the machine).

Under a bounded load through both gateways (non-stream chats, counted as sent, answered and
failed by the client, and as reported by the gateways' /metrics):
1. a canary promoted on one gateway is routed by the same percent on the other within a second
   (the `x-pagoda-target` of answers through the other gateway moves to the canary);
2. a gateway killed (SIGKILL) mid-load and started again resumes the rollout where it stood;
3. a server replica killed mid-load loses no request: each is retried on the other replica of
   its target or falls back to stable;
4. a per-key limit of N requests a minute admits exactly N of a concurrent burst spread over
   both gateways (Redis holds the window).

Needs root for `ip netns`; where namespaces cannot be made (a container without
CAP_NET_ADMIN), every process gets its own loopback address instead (127.0.0.x) and the script
says so. Usage: multi_host.py --pagoda target/debug/pagoda --model smollm2:135m
"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ADMIN = "multi-host-admin-key"
LOAD_KEY = "pk-multi-host-load"
LIMITED_KEY = "pk-multi-host-limited"
LIMIT_RPM = 20
NODES = {"redis": 2, "s1": 11, "s2": 12, "s3": 13, "g1": 21, "g2": 22}
FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True)


class Net:
    """The hosts: network namespaces on a bridge, or loopback addresses as a fallback."""

    def __init__(self):
        self.tag = f"pg{os.getpid() % 100000}"
        self.namespaces = False
        try:
            self._make_namespaces()
            self.namespaces = True
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            err = getattr(e, "stderr", b"") or b""
            print(f"note: network namespaces unavailable ({err.decode().strip() or e}); "
                  "each process gets its own loopback address instead")
            self.teardown()

    def _make_namespaces(self):
        bridge = f"{self.tag}br"
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", "10.77.0.1/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for name, n in NODES.items():
            ns = f"{self.tag}-{name}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", f"{self.tag}{n}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", f"{self.tag}{n}", "master", bridge, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.77.0.{n}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def ip(self, name):
        return f"10.77.0.{NODES[name]}" if self.namespaces else f"127.0.0.{NODES[name]}"

    def run(self, name, argv, log, env=None):
        prefix = ["ip", "netns", "exec", f"{self.tag}-{name}"] if self.namespaces else []
        return subprocess.Popen(prefix + argv, stdout=log, stderr=log, env=env, start_new_session=True)

    def teardown(self):
        for name in NODES:
            subprocess.run(["ip", "netns", "del", f"{self.tag}-{name}"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.tag}br"], capture_output=True)


def http(method, url, body=None, key=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key:
        req.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def wait_http(url, deadline_s=300):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            if http("GET", url, timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


class System:
    def __init__(self, pagoda, model, work, net):
        self.pagoda, self.model, self.work, self.net = pagoda, model, work, net
        self.procs = {}
        self.prefix = f"mh-{os.getpid()}"

    def log(self, name):
        return open(os.path.join(self.work, f"{name}.log"), "ab")

    def start_redis(self):
        self.procs["redis"] = self.net.run("redis", [
            "redis-server", "--bind", self.net.ip("redis"), "--port", "6379", "--save", "",
            "--appendonly", "no", "--protected-mode", "no"], self.log("redis"))

    def start_server(self, name):
        self.procs[name] = self.net.run(name, [
            self.pagoda, "serve", "--model", self.model, "--host", self.net.ip(name), "--port", "8000",
            "--threads", "1", "--kv-cache-memory", "64MiB"], self.log(name), env=dict(os.environ))

    def server_url(self, name):
        return f"http://{self.net.ip(name)}:8000"

    def gateway_url(self, name):
        return f"http://{self.net.ip(name)}:8080"

    def write_config(self):
        import hashlib
        h = lambda k: "sha256:" + hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
        cfg = f"""
[redis]
url = "redis://{self.net.ip('redis')}:6379"
prefix = "{self.prefix}"
[health]
interval_ms = 300
unhealthy_after = 1
[retry]
max_attempts = 3
base_backoff_ms = 10
max_backoff_ms = 50
[[target]]
name = "stable"
model = "{self.model}"
replicas = ["{self.server_url('s1')}", "{self.server_url('s2')}"]
[[target]]
name = "canary"
model = "{self.model}"
replicas = ["{self.server_url('s3')}"]
[[route]]
model = "chat"
fallback = ["stable"]
[route.rollout]
stable = "stable"
canary = "canary"
steps = [10, 50, 100]
hold_s = 3600
min_requests = 1000000
interval_s = 0.2
[[key]]
name = "load"
key_sha256 = "{h(LOAD_KEY)}"
[[key]]
name = "limited"
key_sha256 = "{h(LIMITED_KEY)}"
rpm = {LIMIT_RPM}
"""
        self.config = {}
        for g in ("g1", "g2"):
            path = os.path.join(self.work, f"{g}.toml")
            with open(path, "w") as f:
                f.write(f'[storage]\nsqlite = "{os.path.join(self.work, g + ".db")}"\n' + cfg)
            self.config[g] = path

    def start_gateway(self, name):
        env = dict(os.environ, PAGODA_GATEWAY_ADMIN_KEY=ADMIN)
        self.procs[name] = self.net.run(name, [
            self.pagoda, "gateway", "--config", self.config[name], "--listen",
            f"{self.net.ip(name)}:8080"], self.log(name), env=env)
        return wait_http(self.gateway_url(name) + "/health", 60)

    def kill(self, name):
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def stop_all(self):
        for name in list(self.procs):
            self.kill(name)

    def rollout(self, g):
        status, _, body = http("GET", self.gateway_url(g) + "/admin/rollouts", key=ADMIN)
        return json.loads(body)["data"][0] if status == 200 else {}

    def promote(self, g):
        return http("POST", self.gateway_url(g) + "/admin/rollouts/chat/promote", {}, key=ADMIN)[0]


class Load:
    """Closed-loop clients alternating the two gateways, counting every request."""

    def __init__(self, system, clients=3):
        self.s = system
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = self.answered = 0
        self.failed = []
        self.targets = {"g1": [], "g2": []}
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]

    def client(self, i):
        n = 0
        while not self.stop.is_set():
            g = ("g1", "g2")[(i + n) % 2]
            n += 1
            body = {"model": "chat", "max_tokens": 2, "temperature": 0, "user": f"c{i}-{n}",
                    "messages": [{"role": "user", "content": f"Say a number: {i}-{n}"}]}
            with self.lock:
                self.sent += 1
            try:
                status, headers, raw = http("POST", self.s.gateway_url(g) + "/v1/chat/completions", body,
                                            key=LOAD_KEY, timeout=120)
            except OSError as e:  # a gateway being killed: connection refused or reset
                status, headers, raw = None, {}, str(e).encode()
            with self.lock:
                if status == 200:
                    self.answered += 1
                    self.targets[g].append((time.time(), headers.get("x-pagoda-target")))
                else:
                    self.failed.append((g, status, raw[:200]))
            if status != 200:
                time.sleep(0.05)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


def reported(system):
    """Requests the gateways counted, by status class, from their /metrics."""
    total = {}
    for g in ("g1", "g2"):
        try:
            _, _, body = http("GET", system.gateway_url(g) + "/metrics", timeout=10)
        except OSError:
            continue
        for line in body.decode().splitlines():
            m = re.match(r'pagoda_gateway_requests_total\{([^}]*)\} ([0-9.e+]+)', line)
            if m:
                code = re.search(r'status="(\d)', m.group(1))
                k = (code.group(1) + "xx") if code else "?"
                total[k] = total.get(k, 0) + float(m.group(2))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--model", default="smollm2:135m")
    args = ap.parse_args()
    if not shutil.which("redis-server"):
        print("FAIL redis-server is not installed (.ci/run installs it)")
        return 1
    pagoda = os.path.abspath(args.pagoda)
    work = tempfile.mkdtemp(prefix="pagoda-multi-host-")
    net = Net()
    system = System(pagoda, args.model, work, net)
    try:
        system.start_redis()
        for s in ("s1", "s2", "s3"):
            system.start_server(s)
        for s in ("s1", "s2", "s3"):
            if not wait_http(system.server_url(s) + "/ready"):
                raise RuntimeError(f"{s} did not become ready; see {work}/{s}.log")
        system.write_config()
        for g in ("g1", "g2"):
            if not system.start_gateway(g):
                raise RuntimeError(f"{g} did not start; see {work}/{g}.log")
        where = "its own network namespace" if net.namespaces else "its own loopback address"
        print(f"3 servers, 2 gateways and Redis up, each in {where} (logs: {work})")

        with Load(system) as load:
            time.sleep(2)
            # 1. A promotion on g1 is routed the same way by g2 within a second.
            before = system.rollout("g2").get("canary_percent")
            check(system.promote("g1") == 200, "promote on g1")
            t0 = time.time()
            while time.time() - t0 < 3 and system.rollout("g2").get("canary_percent") != 50.0:
                time.sleep(0.05)
            took = time.time() - t0
            check(before == 10.0 and system.rollout("g2").get("canary_percent") == 50.0 and took < 1.0,
                  f"g2 routes the canary at 50 % {took:.2f} s after the promotion on g1")
            mark = time.time()
            time.sleep(4)
            with load.lock:
                after = [t for ts, t in load.targets["g2"] if ts > mark + 1]
            share = after.count("canary") / max(1, len(after))
            check(len(after) >= 6 and 0.15 <= share <= 0.85,
                  f"answers through g2 after the promotion: {after.count('canary')} of {len(after)} from the canary")

            # 2. A gateway killed mid-load resumes the rollout when it comes back.
            system.kill("g1")
            time.sleep(1)
            check(system.start_gateway("g1"), "g1 restarted")
            r = system.rollout("g1")
            check(r.get("step") == 1 and r.get("canary_percent") == 50.0,
                  f"the restarted g1 resumes at step {r.get('step')}, {r.get('canary_percent')} %")
            failed_before_server_kill = len(load.failed)

            # 3. A server replica killed mid-load: its requests go to the other stable replica.
            time.sleep(1)
            system.kill("s1")
            time.sleep(5)
        lost = load.failed[failed_before_server_kill:]
        check(not lost, f"killing s1 mid-load lost no request ({len(lost)} failed: {lost[:3]})")
        via_killed_gateway = [f for f in load.failed[:failed_before_server_kill] if f[0] == "g1"]
        check(len(via_killed_gateway) == len(load.failed[:failed_before_server_kill]),
              "the only failures before the server kill are requests to the killed gateway itself")
        rep = reported(system)
        print(f"load: sent {load.sent}, answered {load.answered}, failed {len(load.failed)}; "
              f"reported by the gateways (g1 since its restart): {rep}")
        check(load.sent == load.answered + len(load.failed), "every request sent is answered or failed")

        # 4. A per-key limit holds across both gateways under a concurrent burst.
        def one(i):
            g = ("g1", "g2")[i % 2]
            body = {"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
            return http("POST", system.gateway_url(g) + "/v1/chat/completions", body, key=LIMITED_KEY,
                        timeout=120)[0]

        with cf.ThreadPoolExecutor(16) as ex:
            codes = list(ex.map(one, range(3 * LIMIT_RPM)))
        check(codes.count(200) == LIMIT_RPM and codes.count(429) == 2 * LIMIT_RPM,
              f"a burst of {3 * LIMIT_RPM} over two gateways with rpm {LIMIT_RPM}: "
              f"{codes.count(200)} admitted, {codes.count(429)} refused (others: "
              f"{[c for c in codes if c not in (200, 429)]})")
    except Exception as e:  # noqa: BLE001 - report, then clean up
        check(False, f"multi-host run: {e}")
    finally:
        system.stop_all()
        net.teardown()
    if FAILURES:
        print(f"{len(FAILURES)} multi-host checks failed (logs: {work})", file=sys.stderr)
        return 1
    print("multi-host: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
