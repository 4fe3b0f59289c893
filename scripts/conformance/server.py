"""A `pagoda serve` child process on an ephemeral port, for the conformance scripts."""

import re
import subprocess
import sys
import tempfile
import time
import urllib.request


class Server:
    """A `pagoda serve` child process on an ephemeral port."""

    def __init__(self, pagoda, model, *extra):
        # The server's log goes to a file (a pipe nobody reads would fill and stall it).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pagoda-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [pagoda, "serve", "--model", model, "--port", "0", *extra],
            stderr=self.log,
        )
        self.url = None
        deadline = time.time() + 300
        while self.url is None and time.time() < deadline:
            if self.proc.poll() is not None:
                break
            with open(self.log.name) as f:
                m = re.search(r"on (http://[0-9.:]+)", f.read())
            if m:
                self.url = m.group(1)
            else:
                time.sleep(0.1)
        if self.url is None:
            with open(self.log.name) as f:
                sys.stderr.write(f.read())
            raise RuntimeError("the server did not start; its log is above")
        print(f"server on {self.url} (log: {self.log.name})")
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/ready") as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("the server did not become ready")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
