"""Child processes of `pagoda` on ephemeral ports, and the check runner, for the conformance
scripts."""

import re
import subprocess
import sys
import tempfile
import time
import urllib.request


# Names of the checks that failed, in order (each script reports them at its end).
failures = []


def check(name, fn):
    """Runs one check: prints ok or FAIL with the reason, and keeps going either way."""
    try:
        fn()
        print(f"ok   {name}")
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        failures.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}")


class Child:
    """A `pagoda` child process whose log (a file: a pipe nobody reads would fill and stall
    it) announces its address; `url` is that address."""

    def __init__(self, argv, pattern, prefix, env=None, timeout=300):
        self.log = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stderr=self.log, env=env)
        self.url = None
        deadline = time.time() + timeout
        while self.url is None and time.time() < deadline and self.proc.poll() is None:
            with open(self.log.name) as f:
                m = re.search(pattern, f.read())
            if m:
                self.url = m.group(1)
            else:
                time.sleep(0.1)
        if self.url is None:
            with open(self.log.name) as f:
                sys.stderr.write(f.read())
            raise RuntimeError(f"{argv[1]} did not start; its log is above")
        print(f"{argv[1]} on {self.url} (log: {self.log.name})")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Server(Child):
    """A `pagoda serve` child process on an ephemeral port, ready (`/ready` answered 200)."""

    def __init__(self, pagoda, model, *extra):
        super().__init__([pagoda, "serve", "--model", model, "--port", "0", *extra],
                         r"on (http://[0-9.:]+)", "pagoda-serve-")
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/ready") as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("the server did not become ready")
