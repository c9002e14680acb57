"""Time to READY for a large ONNX model in object storage, with a cold and a
warm fetch cache, read against what the same run measures of the parts:
the raw download (boto3 streaming the objects to disk) and ONNX Runtime's
session creation (onnxruntime in this process, from the downloaded file).
Issue 45's targets: cold <= 1.2 x (download + session), warm <= 1.1 x
session.

    .venv/bin/python bench/model_fetch.py SERVER_BIN [--mib 200] [--rounds 3] [--single-part]

boto3 uploads the weights in parts, as it does any file over 8 MiB: S3's
ETag is then no MD5, and the cache checks the size alone. `--single-part`
uploads each object whole, so that the ETag is its MD5 and the cache also
hashes what it downloads and checks it.

The S3 server is moto's, on loopback, started here. The model is one MatMul
whose weight is MIB mebibytes of float32, generated here. Each round
measures, in this order: the raw download, the session, nereid-server
started on a new cache folder (cold), and started again on that folder
(warm). Time to READY runs from the server's spawn to its "Started
HTTPService" line, which it logs only once start-up loads are done.
Prints each round's figures and ratios, then the medians.

A benchmark, not a test: nothing fails on a timing. Loopback only; every
process it starts it stops.
"""

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

BUCKET = "bench"
MODEL = "big"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}
STARTED = re.compile(r"Started HTTPService at")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Stops a process this script started: SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_model(folder: Path, mib: int) -> Path:
    """MODEL/config.pbtxt and MODEL/1/model.onnx: Y = X @ W, W of MIB MiB."""
    side = int((mib * (1 << 20) / 4) ** 0.5)
    weight = np.random.default_rng(0).standard_normal((side, side), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "big",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, side])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, side])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / MODEL / "1").mkdir(parents=True)
    onnx.save(model, folder / MODEL / "1" / "model.onnx")
    (folder / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1, {side} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1, {side} ] }} ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
    )
    return folder / MODEL


def start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def wait_for_s3(client, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.list_buckets()
            return
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.2)


def raw_download(client, keys: list[str], into: Path) -> float:
    """Seconds boto3 takes to stream every object of the model to disk."""
    shutil.rmtree(into, ignore_errors=True)
    started = time.perf_counter()
    for key in keys:
        target = into / key
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - started


def session_creation(model_file: Path) -> float:
    started = time.perf_counter()
    onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return time.perf_counter() - started


def time_to_ready(server_bin: str, endpoint: str, cache: Path, log: Path) -> float:
    env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    # scripts/build.sh stages the library beside the binaries (OUT/lib).
    staged = Path(server_bin).resolve().parent.parent / "lib" / "libonnxruntime.so"
    if "ORT_DYLIB_PATH" not in env and staged.exists():
        env["ORT_DYLIB_PATH"] = str(staged)
    args = [server_bin, "--model-repository", f"s3://{BUCKET}/repo", "--model-cache-dir", str(cache),
            "--model-control-mode", "explicit", "--load-model", MODEL, "--exit-on-error",
            "--http-address", "127.0.0.1", "--http-port", "0", "--grpc-address", "127.0.0.1",
            "--grpc-port", "0", "--allow-metrics", "false"]
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in proc.stdout:
                out.write(line)
                if STARTED.search(line):
                    return time.perf_counter() - started
            raise RuntimeError(f"the server exited before it was ready; see {log}")
        finally:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server_bin")
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single-part", action="store_true",
                        help="upload each object whole (its ETag is its MD5, which the cache checks)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="nereid-bench-fetch-"))
    moto, endpoint = start_moto(work / "moto.log")
    try:
        client = s3_client(endpoint)
        wait_for_s3(client, moto)
        client.create_bucket(Bucket=BUCKET)
        model = make_model(work / "source", args.mib)
        keys = []
        for path in sorted(model.rglob("*")):
            if path.is_file():
                key = f"repo/{MODEL}/{path.relative_to(model).as_posix()}"
                if args.single_part:
                    with open(path, "rb") as body:
                        client.put_object(Bucket=BUCKET, Key=key, Body=body)
                else:
                    client.upload_file(str(path), BUCKET, key)
                keys.append(key)
        size = sum((model / k.split(f"{MODEL}/", 1)[1]).stat().st_size for k in keys)
        etags = [client.head_object(Bucket=BUCKET, Key=k)["ETag"].strip('"') for k in keys]
        checked = "ETags are MD5s: checked" if all("-" not in e for e in etags) else "multipart ETags: size checked"
        print(f"model: {size / (1 << 20):.1f} MiB in {len(keys)} objects ({checked}); "
              f"onnxruntime {onnxruntime.__version__}; server {args.server_bin}")
        rows = []
        for round_ in range(1, args.rounds + 1):
            download = raw_download(client, keys, work / "raw")
            session = session_creation(work / "raw" / "repo" / MODEL / "1" / "model.onnx")
            cache = work / f"cache-{round_}"
            cold = time_to_ready(args.server_bin, endpoint, cache, work / f"cold-{round_}.log")
            warm = time_to_ready(args.server_bin, endpoint, cache, work / f"warm-{round_}.log")
            shutil.rmtree(cache, ignore_errors=True)
            row = {
                "download": download, "session": session, "cold": cold, "warm": warm,
                "cold_ratio": cold / (download + session), "warm_ratio": warm / session,
            }
            rows.append(row)
            print(f"round {round_}: download {download:.2f} s, session {session:.2f} s, "
                  f"cold {cold:.2f} s ({row['cold_ratio']:.2f} x download + session), "
                  f"warm {warm:.2f} s ({row['warm_ratio']:.2f} x session)")
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"median: download {median['download']:.2f} s, session {median['session']:.2f} s, "
              f"cold {median['cold']:.2f} s, warm {median['warm']:.2f} s; "
              f"cold / (download + session) {median['cold_ratio']:.2f} (target <= 1.2), "
              f"warm / session {median['warm_ratio']:.2f} (target <= 1.1)")
    finally:
        stop(moto)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
