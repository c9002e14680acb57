"""A model repository in S3, served by a real S3-compatible server (moto's
server mode) on 127.0.0.1: models are listed, fetched and served."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
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
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
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
        yield endpoint, client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def s3_server(s3_endpoint, tmp_path_factory):
    endpoint, _ = s3_endpoint
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
    _, s3 = s3_endpoint
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
    endpoint, _ = s3_endpoint
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
