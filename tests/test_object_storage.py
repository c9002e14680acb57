"""A model repository in S3, served by a real S3-compatible server (moto's
server mode) on 127.0.0.1: models are listed, fetched and served."""

from __future__ import annotations

import concurrent.futures
import hashlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from helpers import EXAMPLES_MODELS, HOST, NereidServer, repository_index, simple_http_inputs

BUCKET = "models"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    port = _free_port()
    moto = Path(sys.executable).parent / "moto_server"
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([str(moto), "-H", HOST, "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://{HOST}:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        client.create_bucket(Bucket=BUCKET)
        for model in ("simple", "identity_bytes"):
            for path in (EXAMPLES_MODELS / model).rglob("*"):
                if path.is_file():
                    key = f"repo/{model}/{path.relative_to(EXAMPLES_MODELS / model).as_posix()}"
                    client.upload_file(str(path), BUCKET, key)
        yield endpoint, client, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def s3_server(s3_endpoint, tmp_path_factory):
    endpoint, _, _ = s3_endpoint
    cache = tmp_path_factory.mktemp("cache")
    server = NereidServer(
        [f"s3://{BUCKET}/repo"],
        ["--model-control-mode", "explicit", "--load-model", "simple", "--model-cache-dir", str(cache),
         "--exit-timeout-secs", "10"],
        log_path=tmp_path_factory.mktemp("logs-s3") / "s3.log",
        env={**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint},
    ).start()
    yield server
    server.stop_and_check()
    shutil.rmtree(cache, ignore_errors=True)


def test_models_in_s3_are_listed_loaded_and_served(s3_server):
    index = repository_index(s3_server)
    assert index["simple"]["state"] == "READY"
    assert "identity_bytes" in index and index["identity_bytes"].get("state") != "READY"
    client = httpclient.InferenceServerClient(s3_server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = simple_http_inputs(a, b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_a_model_is_fetched_again_on_load(s3_server, s3_endpoint):
    _, s3, _ = s3_endpoint
    client = httpclient.InferenceServerClient(s3_server.http_url)
    client.load_model("identity_bytes")
    assert client.is_model_ready("identity_bytes")
    # Change the model in the bucket; a reload picks the change up.
    config = (EXAMPLES_MODELS / "identity_bytes" / "config.pbtxt").read_text()
    s3.put_object(Bucket=BUCKET, Key="repo/identity_bytes/config.pbtxt",
                  Body=config.replace("max_batch_size: 8", "max_batch_size: 3").encode())
    client.load_model("identity_bytes")
    assert client.get_model_config("identity_bytes")["max_batch_size"] == 3


def test_a_missing_model_in_s3_fails_cleanly(s3_server):
    client = httpclient.InferenceServerClient(s3_server.http_url)
    with pytest.raises(Exception) as exc:
        client.load_model("not_there")
    assert "not_there" in str(exc.value)
    assert client.is_model_ready("simple")


def test_nereid_fetch_copies_one_model_folder(s3_endpoint, tmp_path):
    endpoint, _, _ = s3_endpoint
    fetch = Path(__file__).resolve().parent.parent / "target" / "debug" / "nereid-fetch"
    destination = tmp_path / "my-model"
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(fetch), f"s3://{BUCKET}/repo/simple", str(destination)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for path in (EXAMPLES_MODELS / "simple").rglob("*"):
        if path.is_file():
            assert (destination / path.relative_to(EXAMPLES_MODELS / "simple")).read_bytes() == path.read_bytes()
    missing = subprocess.run([str(fetch), f"s3://{BUCKET}/repo/nothing", str(tmp_path / "x")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "nothing" in missing.stderr
    assert not (tmp_path / "x").exists()


def _upload(s3, model: str, prefix: str) -> int:
    """Uploads an example model under PREFIX/; returns how many files."""
    count = 0
    for path in (EXAMPLES_MODELS / model).rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{prefix}/{model}/{path.relative_to(EXAMPLES_MODELS / model).as_posix()}")
            count += 1
    return count


def _object_gets(moto_log: Path, prefix: str) -> int:
    """GetObject requests moto served for keys under PREFIX/ (listings, which
    are GETs on the bucket itself, are not counted)."""
    return sum(f'"GET /{BUCKET}/{prefix}/' in line for line in moto_log.read_text().splitlines())


def _serving(prefix: str, cache: Path, endpoint: str, log: Path) -> NereidServer:
    return NereidServer(
        [f"s3://{BUCKET}/{prefix}"],
        ["--model-control-mode", "explicit", "--load-model", "simple", "--model-cache-dir", str(cache)],
        log_path=log,
        env={**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint},
    )


def _infer_simple(server: NereidServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.int32)
    result = client.infer("simple", simple_http_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_a_warm_cache_downloads_nothing(s3_endpoint, tmp_path):
    """Bar 2 of the lifecycle issue: a second start with the same cache
    folder sends moto no GetObject; a changed object is the one downloaded."""
    endpoint, s3, moto_log = s3_endpoint
    files = _upload(s3, "simple", "warm")
    cache = tmp_path / "cache"

    before = _object_gets(moto_log, "warm")
    first = _serving("warm", cache, endpoint, tmp_path / "first.log").start()
    _infer_simple(first)
    first.stop_and_check()
    cold = _object_gets(moto_log, "warm") - before
    assert cold == files

    second = _serving("warm", cache, endpoint, tmp_path / "second.log").start()
    try:
        _infer_simple(second)
        assert _object_gets(moto_log, "warm") - before == cold, "the warm start downloaded objects"

        # A changed config is the one object fetched again on reload.
        config = (EXAMPLES_MODELS / "simple" / "config.pbtxt").read_text()
        s3.put_object(Bucket=BUCKET, Key="warm/simple/config.pbtxt",
                      Body=(config + "\n# changed\n").encode())
        httpclient.InferenceServerClient(second.http_url).load_model("simple")
        _infer_simple(second)
        assert _object_gets(moto_log, "warm") - before == cold + 1
    finally:
        second.stop_and_check()
    # The blob of the replaced config was cleaned up: one blob per file.
    blobs = [p for p in (cache / "repository-0" / ".objects").iterdir() if "." not in p.name]
    assert len(blobs) == files


def test_two_servers_share_one_cache_folder(s3_endpoint, tmp_path):
    """Started together on one cache folder, both servers load the model,
    each object is downloaded once between them, and nothing half-written
    is left."""
    endpoint, s3, moto_log = s3_endpoint
    files = _upload(s3, "simple", "shared")
    cache = tmp_path / "cache"
    before = _object_gets(moto_log, "shared")
    servers = [_serving("shared", cache, endpoint, tmp_path / f"server{i}.log") for i in range(2)]
    # Started at once: each fetches while the other does.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(NereidServer.start, servers))
    try:
        for server in servers:
            _infer_simple(server)
    finally:
        for server in servers:
            server.stop_and_check()
    # One of them downloads each object; the other waits for it and reuses it.
    assert _object_gets(moto_log, "shared") - before == files
    names = sorted(p.name for p in (cache / "repository-0" / ".objects").iterdir())
    assert not [n for n in names if ".tmp-" in n], names
    assert len([n for n in names if "." not in n]) == files
    assert sorted(p.name for p in (cache / "repository-0").iterdir() if p.name.startswith(".simple.partial")) == []


def test_poll_mode_picks_up_a_changed_model_in_s3(s3_endpoint, tmp_path):
    """Poll mode over object storage: the listing shows a changed config,
    the reload downloads that object alone, and the new config serves."""
    endpoint, s3, moto_log = s3_endpoint
    files = _upload(s3, "simple", "polled")
    before = _object_gets(moto_log, "polled")
    server = NereidServer(
        [f"s3://{BUCKET}/polled"],
        ["--model-control-mode", "poll", "--repository-poll-secs", "1", "--model-cache-dir", str(tmp_path / "cache")],
        log_path=tmp_path / "server.log",
        env={**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint},
    ).start()
    try:
        _infer_simple(server)
        # Polls that find nothing changed download nothing.
        time.sleep(3)
        assert _object_gets(moto_log, "polled") - before == files
        config = (EXAMPLES_MODELS / "simple" / "config.pbtxt").read_text()
        assert "max_batch_size: 8" in config
        s3.put_object(Bucket=BUCKET, Key="polled/simple/config.pbtxt",
                      Body=config.replace("max_batch_size: 8", "max_batch_size: 2").encode())
        client = httpclient.InferenceServerClient(server.http_url)
        deadline = time.monotonic() + 30
        while client.get_model_config("simple")["max_batch_size"] != 2:
            assert time.monotonic() < deadline, "the changed config was not picked up"
            time.sleep(0.2)
        _infer_simple(server)
        assert _object_gets(moto_log, "polled") - before == files + 1
    finally:
        server.stop_and_check()


class _StallingS3(BaseHTTPRequestHandler):
    """Enough of S3 for one model folder (ListObjectsV2 and GetObject), whose
    big object stops halfway until the test lets it go on: a download that
    is, for certain, in progress."""

    objects: dict[str, bytes] = {}
    stalled_key = ""
    halfway = threading.Event()
    release = threading.Event()

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path, _, query = self.path.partition("?")
        bucket, _, key = path.lstrip("/").partition("/")
        key = urllib.parse.unquote(key)
        modified = "2026-12-07T00:00:00.000Z"
        if not key and "list-type=2" in query:
            prefix = urllib.parse.parse_qs(query).get("prefix", [""])[0]
            entries = "".join(
                f"<Contents><Key>{k}</Key><LastModified>{modified}</LastModified>"
                f"<ETag>&quot;{hashlib.md5(v).hexdigest()}&quot;</ETag><Size>{len(v)}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
                for k, v in sorted(self.objects.items())
                if k.startswith(prefix)
            )
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>'
                '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<Name>{bucket}</Name><Prefix>{prefix}</Prefix><IsTruncated>false</IsTruncated>{entries}"
                "</ListBucketResult>"
            ).encode()
            self._send(200, body, "application/xml")
            return
        data = self.objects.get(key)
        if data is None:
            self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", "application/xml")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
        self.send_header("Last-Modified", "Mon, 07 Dec 2026 00:00:00 GMT")
        self.end_headers()
        if key == self.stalled_key:
            half = len(data) // 2
            self.wfile.write(data[:half])
            self.wfile.flush()
            self.halfway.set()
            self.release.wait(60)
            self.wfile.write(data[half:])
        else:
            self.wfile.write(data)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_nereid_fetch_serves_its_progress_while_it_downloads(tmp_path):
    weights = np.random.default_rng(0).bytes(4 << 20)
    config = b'name: "m"\n'
    _StallingS3.objects = {"repo/m/1/model.onnx": weights, "repo/m/config.pbtxt": config}
    _StallingS3.stalled_key = "repo/m/1/model.onnx"
    s3 = ThreadingHTTPServer((HOST, 0), _StallingS3)
    threading.Thread(target=s3.serve_forever, daemon=True).start()
    port = _free_port()
    fetch = Path(__file__).resolve().parent.parent / "target" / "debug" / "nereid-fetch"
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{HOST}:{s3.server_port}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [str(fetch), f"s3://{BUCKET}/repo/m", str(tmp_path / "m"), "--progress-port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert _StallingS3.halfway.wait(60), "the download never started"
        total = len(weights) + len(config)
        # The objects come in key order: the weights first, stopped halfway.
        deadline = time.monotonic() + 30
        while True:
            try:
                progress = requests.get(f"http://{HOST}:{port}/progress", timeout=5).json()
            except requests.ConnectionError:
                progress = None
            if progress == {"bytes_total": total, "bytes_done": len(weights) // 2}:
                break
            assert time.monotonic() < deadline, f"progress never showed the halfway point: {progress}"
            time.sleep(0.05)
        _StallingS3.release.set()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert (tmp_path / "m" / "1" / "model.onnx").read_bytes() == weights
        # The endpoint ends with the fetch.
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{HOST}:{port}/progress", timeout=5)
    finally:
        _StallingS3.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        s3.shutdown()
