"""The image's smoke test (scripts/image.sh runs it against the server it
started from the image): tritonclient over HTTP and gRPC, an ONNX model and a
Python model, and the process as a container should leave it: uid 65532, a
read-only root, its Python stub the same user."""

import argparse
import os
import sys
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

READY_WITHIN_S = 120
USER = 65532


def fail(message: str) -> None:
    print(f"smoke: {message}", file=sys.stderr)
    sys.exit(1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_ready(client: httpclient.InferenceServerClient, pid: int) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if not alive(pid):
            fail("the server exited before it was ready")
        try:
            if client.is_server_ready() and client.is_model_ready("add_sub"):
                return
            failed = {m["name"]: m.get("reason") for m in client.get_model_repository_index() if m.get("state") == "UNAVAILABLE"}
        except Exception:  # noqa: BLE001 - not listening yet
            failed = {}
        if failed:
            fail(f"models failed to load in the image: {failed}")
        time.sleep(0.2)
    fail(f"the server was not ready within {READY_WITHIN_S} s")


def uids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return [int(v) for v in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def root_options(pid: int) -> list[str]:
    """The mount options of the process's / as it sees it."""
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/":
                return fields[5].split(",")
    raise AssertionError("no root mount")


def check_simple(outputs: dict[str, np.ndarray], a: np.ndarray, b: np.ndarray, how: str) -> None:
    if not (np.array_equal(outputs["OUTPUT0"], a + b) and np.array_equal(outputs["OUTPUT1"], a - b)):
        fail(f"simple over {how} answered {outputs}")


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("pid", "http", "grpc", "metrics"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args()

    http = httpclient.InferenceServerClient(f"127.0.0.1:{args.http}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{args.grpc}")
    wait_ready(http, args.pid)

    not_ready = [m["name"] for m in http.get_model_repository_index() if m.get("state") != "READY"]
    if not_ready:
        fail(f"models not ready in the image: {not_ready}")

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http.infer("simple", inputs)
    check_simple({n: result.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")}, a, b, "HTTP")

    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = grpc.infer("simple", inputs)
    check_simple({n: result.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")}, a, b, "gRPC")

    x = np.array([0.5, 1.5, -2.0, 4.0], dtype=np.float32)
    y = np.array([1.0, 0.25, 2.0, -4.0], dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = grpc.infer("add_sub", inputs)
    if not (np.array_equal(result.as_numpy("OUTPUT0"), x + y) and np.array_equal(result.as_numpy("OUTPUT1"), x - y)):
        fail(f"add_sub answered {result.as_numpy('OUTPUT0')}, {result.as_numpy('OUTPUT1')}")

    with urllib.request.urlopen(f"http://127.0.0.1:{args.metrics}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    if 'nv_inference_request_success{model="simple",version="1"} 2' not in metrics:
        fail("the metrics do not count simple's two requests")

    if set(uids(args.pid)) != {USER}:
        fail(f"the server runs with uids {uids(args.pid)}, not {USER}")
    stubs = children(args.pid)
    if not stubs:
        fail("the Python model's stub process is not a child of the server")
    for stub in stubs:
        if set(uids(stub)) != {USER}:
            fail(f"the server's child {stub} runs with uids {uids(stub)}, not {USER}")
    if "ro" not in root_options(args.pid):
        fail(f"the server's root is mounted {root_options(args.pid)}, not read-only")
    print(f"smoke: simple (HTTP, gRPC) and add_sub answered; uid {USER}, read-only root, {len(stubs)} stub(s)")


if __name__ == "__main__":
    main()
