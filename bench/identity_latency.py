"""p50/p99 latency of single identity requests at concurrency 1, HTTP and gRPC.

A stopgap until nereid-perf (issue 3): the client is Python, so its own
per-request cost is included in every figure; read them as upper bounds on
the server's. Talks only to the server given (loopback by default).

    .venv/bin/python bench/identity_latency.py [--host 127.0.0.1] [--http-port 8000] [--grpc-port 8001] [-n 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(call, n: int) -> list[float]:
    for _ in range(min(200, n)):
        call()
    out = []
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - start) / 1000.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--model", default="identity")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()

    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                    "parameters": {"binary_data_size": data.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    body = header + data.tobytes()
    conn = http.client.HTTPConnection(args.host, args.http_port)

    def http_call():
        conn.request("POST", f"/v2/models/{args.model}/infer", body,
                     {"Inference-Header-Content-Length": str(len(header))})
        resp = conn.getresponse()
        payload = resp.read()
        assert resp.status == 200, payload

    channel = grpc.insecure_channel(f"{args.host}:{args.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name=args.model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, 16])
    request.raw_input_contents.append(data.tobytes())

    def grpc_call():
        stub.ModelInfer(request)

    for name, call in (("http-binary", http_call), ("grpc", grpc_call)):
        samples = measure(call, args.n)
        print(f"{name:12s} n={len(samples)} p50={statistics.median(samples):.0f}us "
              f"p90={percentile(samples, 0.90):.0f}us p99={percentile(samples, 0.99):.0f}us")


if __name__ == "__main__":
    main()
