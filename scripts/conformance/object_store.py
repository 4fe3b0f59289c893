#!/usr/bin/env python3
"""`pagoda pull s3://...` against an S3-compatible server on loopback.

The server is moto's (`moto[server]` from PyPI): an in-memory S3 that implements what the pull
uses (HEAD, ranged and conditional GET, ListObjectsV2) and installs with pip alone, so CI needs
no container or binary download (MinIO would). The bucket is filled with the official boto3
client. Checks: a GGUF object and a Hugging Face folder prefix are pulled byte for byte (sha256
of every stored file against the uploaded bytes), the pulled model answers `pagoda show`, and
bad input gets a clear error and a non-zero exit: a missing key, a missing bucket, a URL with
no key, a folder prefix without config.json, a non-GGUF object.
"""
import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--gguf-model", default="smollm2:135m", help="a GGUF model in the store")
    ap.add_argument("--folder-model", default="all-minilm", help="a Hugging Face folder model in the store")
    args = ap.parse_args()
    pagoda = os.path.abspath(args.pagoda)

    def show_path(name, env=None):
        return subprocess.run([pagoda, "show", "--path", name], check=True, capture_output=True,
                              text=True, env=env).stdout.strip()

    gguf = Path(show_path(args.gguf_model))
    folder = Path(show_path(args.folder_model))
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
        s3.create_bucket(Bucket="models")
        s3.upload_file(str(gguf), "models", "smol/model.gguf")
        uploaded_folder = {}
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                rel = f.relative_to(folder).as_posix()
                s3.upload_file(str(f), "models", f"minilm/{rel}")
                uploaded_folder[rel] = sha256(f)
        s3.put_object(Bucket="models", Key="notes/readme.txt", Body=b"not a model")
        s3.put_object(Bucket="models", Key="bad.gguf", Body=b"this is not a GGUF file at all")

        with tempfile.TemporaryDirectory() as store:
            env = dict(os.environ, PAGODA_HOME=store, AWS_ENDPOINT=endpoint, AWS_ALLOW_HTTP="true", **creds)

            def pull(source, *extra):
                return subprocess.run([pagoda, "pull", "-q", source, *extra], capture_output=True, text=True,
                                      env=env, timeout=300)

            r = pull("s3://models/smol/model.gguf", "--name", "smol-s3")
            check(r.returncode == 0, f"pull s3://models/smol/model.gguf ({r.stderr.strip()[-300:]})")
            if r.returncode == 0:
                got = show_path("smol-s3", env)
                check(sha256(got) == sha256(gguf), "the pulled GGUF has the uploaded bytes")
                info = subprocess.run([pagoda, "show", "smol-s3"], capture_output=True, text=True, env=env)
                check(info.returncode == 0, "pagoda show reads the pulled model")
                again = pull("s3://models/smol/model.gguf", "--name", "smol-s3")
                check(again.returncode == 0, "a second pull of a complete model succeeds")

            r = pull("s3://models/minilm/", "--name", "minilm-s3")
            check(r.returncode == 0, f"pull a Hugging Face folder prefix ({r.stderr.strip()[-300:]})")
            if r.returncode == 0:
                pulled = Path(show_path("minilm-s3", env))
                got = {f.relative_to(pulled).as_posix(): sha256(f) for f in pulled.rglob("*") if f.is_file()}
                wanted = {k: v for k, v in uploaded_folder.items() if k in got}
                check(len(got) > 0 and got == wanted and "config.json" in got,
                      f"every pulled folder file has the uploaded bytes ({len(got)} files)")

            for source, needle, what in [
                ("s3://models/smol/missing.gguf", "not found", "a missing key"),
                ("s3://no-such-bucket/model.gguf", "no-such-bucket", "a missing bucket"),
                ("s3://models", "no object", "a URL without a key"),
                ("s3://models/notes/", "config.json", "a folder prefix without config.json"),
                ("s3://models/bad.gguf", "GGUF", "an object that is not GGUF"),
            ]:
                r = pull(source, "--name", "bad-s3")
                check(r.returncode != 0 and needle in r.stderr and "panicked" not in r.stderr
                      and "No such file" not in r.stderr,
                      f"{what} is a clear error naming it: {r.stderr.strip()[-200:]!r}")
            listed = subprocess.run([pagoda, "list"], capture_output=True, text=True, env=env).stdout
            check("bad-s3" not in listed, "a failed pull leaves no model behind")
            partials = [p.name for p in Path(store).rglob("partial-*")]
            check(not partials, f"no partial file or lock left behind by the failed pulls ({partials})")
    finally:
        server.terminate()
        server.wait(timeout=10)
    if failures:
        print(f"{len(failures)} object storage checks failed", file=sys.stderr)
        sys.exit(1)
    print("object storage: all checks passed")


if __name__ == "__main__":
    main()
