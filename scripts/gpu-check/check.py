"""Issue 43's device check, run by scripts/gpu-check.sh against a started
nereid-server. Each step records "pass", "fail" or "skip" with its figures
and a reason; `--dry-run` runs only what needs no device (and expects the
server to see none). Standard library only, plus what the GPU machine has
(torch, numpy, nvidia-ml-py, cuda-bindings) and the carried tritonclient.

Every request goes to the server on loopback; every step is bounded in
requests and in seconds.
"""

import argparse
import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_FAMILIES = [
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
]


class Check:
    def __init__(self, http, metrics, dry_run):
        self.http = http
        self.metrics = metrics
        self.dry_run = dry_run
        self.steps = []

    def record(self, name, outcome, **figures):
        self.steps.append({"step": name, "outcome": outcome, **figures})
        print(f"[{outcome}] {name}: {json.dumps(figures)}", flush=True)

    def run(self, name, step):
        try:
            step()
        except Skip as skip:
            self.record(name, "skip", reason=str(skip))
        except Exception as error:  # a failed step must not stop the others
            self.record(name, "fail", error=f"{type(error).__name__}: {error}")

    # -- HTTP ---------------------------------------------------------------

    def get(self, path, base=None):
        with urllib.request.urlopen((base or self.http) + path, timeout=30) as answer:
            return answer.read().decode()

    def post(self, path, body):
        request = urllib.request.Request(
            self.http + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                text = answer.read().decode()
                return answer.status, (json.loads(text) if text else {})
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read().decode() or "{}")

    def model_index(self):
        _, index = self.post("/v2/repository/index", {})
        return {row["name"]: row for row in index}


class Skip(Exception):
    """A step that cannot run here, with the reason."""


def parse_metrics(text):
    """{family: {gpu_uuid: value}} for the GPU families."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        if name not in GPU_FAMILIES:
            continue
        labels, value = rest.rsplit("}", 1)
        uuid = labels.split('gpu_uuid="', 1)[1].split('"', 1)[0]
        found.setdefault(name, {})[uuid] = float(value)
    return found


# -- steps --------------------------------------------------------------------


def step_placement(check):
    """KIND_GPU and KIND_AUTO as the server resolved them."""
    index = check.model_index()
    mlp = index.get("torch_mlp", {})
    if check.dry_run:
        reason = mlp.get("reason", "")
        ok = mlp.get("state") == "UNAVAILABLE" and "KIND_GPU" in reason and "sees no GPU" in reason
        auto = json.loads(check.get("/v2/models/identity_gpu/config"))["instance_group"][0]
        ok = ok and auto["kind"] == "KIND_CPU"
        check.record(
            "placement without a GPU",
            "pass" if ok else "fail",
            torch_mlp=mlp,
            identity_gpu_group=auto,
        )
        return
    config = json.loads(check.get("/v2/models/torch_mlp/config"))
    auto = json.loads(check.get("/v2/models/identity_gpu/config"))["instance_group"][0]
    group = config["instance_group"][0]
    ok = mlp.get("state") == "READY" and group["kind"] == "KIND_GPU" and auto["kind"] == "KIND_GPU"
    check.record("placement on the GPU", "pass" if ok else "fail", torch_mlp_group=group, identity_gpu_group=auto)


def step_metrics(check):
    """The GPU families against nvidia-smi's readings of the same devices."""
    text = check.get("/metrics", base=check.metrics)
    found = parse_metrics(text)
    if check.dry_run:
        check.record(
            "no GPU metric family without a GPU",
            "pass" if not found else "fail",
            families_seen=sorted(found),
        )
        return
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=uuid,name,memory.total,memory.used,power.limit,utilization.gpu",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise Skip(f"nvidia-smi cannot be run: {error}")
    rows = []
    ok = set(GPU_FAMILIES) <= set(found)
    for line in smi.strip().splitlines():
        uuid, name, total_mib, used_mib, limit_w, util = [f.strip() for f in line.split(",")]
        if uuid not in found.get("nv_gpu_memory_total_bytes", {}):
            # Not visible to the server (CUDA_VISIBLE_DEVICES).
            continue
        total = found["nv_gpu_memory_total_bytes"][uuid]
        used = found["nv_gpu_memory_used_bytes"][uuid]
        limit = found.get("nv_gpu_power_limit", {}).get(uuid)
        row = {
            "uuid": uuid,
            "name": name,
            "memory_total_server_mib": total / 2**20,
            "memory_total_smi_mib": float(total_mib),
            "memory_used_server_mib": used / 2**20,
            "memory_used_smi_mib": float(used_mib),
            "power_limit_server_w": limit,
            "power_limit_smi_w": float(limit_w) if limit_w not in ("[N/A]", "") else None,
            "utilization_server": found["nv_gpu_utilization"][uuid],
            "utilization_smi_percent": util,
        }
        # Total memory and the power limit are fixed; used memory moves
        # between the two readings, so it gets a margin.
        ok = ok and abs(row["memory_total_server_mib"] - row["memory_total_smi_mib"]) <= 1
        ok = ok and abs(row["memory_used_server_mib"] - row["memory_used_smi_mib"]) <= 512
        if limit is not None and row["power_limit_smi_w"] is not None:
            ok = ok and abs(limit - row["power_limit_smi_w"]) <= 1
        ok = ok and 0.0 <= row["utilization_server"] <= 1.0
        rows.append(row)
    check.record("GPU metrics against nvidia-smi", "pass" if ok and rows else "fail", devices=rows)


def infer_binary(connection, model, rows, width, payload):
    """One binary-extension request of `rows` x `width` FP32; the output bytes."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [rows, width],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    connection.request(
        "POST",
        f"/v2/models/{model}/infer",
        body=header + payload,
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )
    answer = connection.getresponse()
    body = answer.read()
    if answer.status != 200:
        raise RuntimeError(f"HTTP {answer.status}: {body[:300]!r}")
    length = int(answer.headers["Inference-Header-Content-Length"])
    return body[length:]


def torch_or_skip():
    try:
        import numpy
        import torch
    except ImportError as error:
        raise Skip(f"torch is not installed here: {error}")
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    return numpy, torch


def reference(device):
    """The served model's own weights and forward, imported from its file."""
    import importlib.util

    path = os.path.join(HERE, "models", "torch_mlp", "1", "model.py")
    spec = importlib.util.spec_from_file_location("torch_mlp_model", path)
    # The file imports pb_utils, which exists only in the stub; weights()
    # and forward() do not use it.
    sys.modules.setdefault("triton_python_backend_utils", type(sys)("triton_python_backend_utils"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    w, b = module.weights(device)
    return module, w, b


def step_torch_batching(check, url):
    """Concurrent requests through dynamic batching, each answer against
    the same computation in this process."""
    if check.dry_run:
        raise Skip("needs a GPU (torch_mlp is KIND_GPU)")
    np, torch = torch_or_skip()
    device = torch.device("cuda", 0)
    module, w, b = reference(device)
    rng = np.random.default_rng(7)
    requests = [rng.standard_normal((int(rng.integers(1, 5)), 1024), dtype=np.float32) for _ in range(256)]
    answers = [None] * len(requests)
    host, port = url.split("//", 1)[1].split(":")

    def worker(indices):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        for i in indices:
            data = infer_binary(connection, "torch_mlp", requests[i].shape[0], 1024, requests[i].tobytes())
            answers[i] = np.frombuffer(data, dtype=np.float32).reshape(requests[i].shape)
        connection.close()

    threads = [threading.Thread(target=worker, args=(range(t, len(requests), 16),)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    worst = 0.0
    for x, y in zip(requests, answers):
        if y is None:
            raise RuntimeError("a request got no answer")
        want = module.forward(torch.from_numpy(x).to(device), w, b).cpu().numpy()
        worst = max(worst, float(np.abs(want - y).max()))
    stats = json.loads(check.get("/v2/models/torch_mlp/stats"))["model_stats"][0]
    executions, inferences = stats["execution_count"], stats["inference_count"]
    # Rows may meet cuBLAS kernels of other batch sizes: equal to float
    # rounding, not bit for bit.
    ok = worst <= 1e-4 and executions < len(requests)
    check.record(
        "torch on the GPU through dynamic batching",
        "pass" if ok else "fail",
        requests=len(requests),
        executions=executions,
        inferences=inferences,
        max_abs_difference=worst,
    )


def step_cuda_shared_memory(check):
    """Input and output in CUDA shared memory made by tritonclient."""
    if check.dry_run:
        # Without a GPU a register must be refused with the reason.
        handle = base64.b64encode(bytes(64)).decode()
        status, answer = check.post(
            "/v2/cudasharedmemory/region/probe/register",
            {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 64},
        )
        ok = status == 400 and "no GPU" in answer.get("error", "")
        check.record("CUDA shared memory refused without a GPU", "pass" if ok else "fail", status=status, answer=answer)
        return
    try:
        import numpy as np
        import tritonclient.utils.cuda_shared_memory as cudashm
    except ImportError as error:
        raise Skip(f"tritonclient's CUDA shared memory needs cuda-bindings: {error}")
    values = np.arange(4096, dtype=np.float32)
    size = values.nbytes
    regions = []
    try:
        source = cudashm.create_shared_memory_region("check_in", size, 0)
        regions.append(source)
        target = cudashm.create_shared_memory_region("check_out", size, 0)
        regions.append(target)
        cudashm.set_shared_memory_region(source, [values])
        for name, handle in (("check_in", source), ("check_out", target)):
            raw = cudashm.get_raw_handle(handle)
            status, answer = check.post(
                f"/v2/cudasharedmemory/region/{name}/register",
                {"raw_handle": {"b64": raw.decode() if isinstance(raw, bytes) else raw}, "device_id": 0, "byte_size": size},
            )
            if status != 200:
                raise RuntimeError(f"register {name}: HTTP {status} {answer}")

        def region(name):
            return {"shared_memory_region": name, "shared_memory_byte_size": size}

        status, answer = check.post(
            "/v2/models/identity_gpu/infer",
            {
                "inputs": [{"name": "IN", "shape": [4096], "datatype": "FP32", "parameters": region("check_in")}],
                "outputs": [{"name": "OUT", "parameters": region("check_out")}],
            },
        )
        if status != 200:
            raise RuntimeError(f"infer: HTTP {status} {answer}")
        out = cudashm.get_contents_as_numpy(target, "FP32", [4096])
        listed = json.loads(check.get("/v2/cudasharedmemory/status"))
        ok = bool(np.array_equal(out, values * 2)) and len(listed) == 2
        check.record(
            "CUDA shared memory input and output",
            "pass" if ok else "fail",
            regions=listed,
            output_parameters=answer["outputs"][0].get("parameters"),
        )
    finally:
        check.post("/v2/cudasharedmemory/unregister", {})
        for handle in regions:
            cudashm.destroy_shared_memory_region(handle)


def step_device_batches(check, unit_tests, unit_status):
    """nereid-gpu's tests on the device: a batch gathered in pinned memory,
    copied to the device in one transfer and read back equal. (ONNX
    Runtime's GPU instances run on that staging; this machine has no
    onnxruntime-gpu to serve one, and Python models stage through torch.)"""
    if check.dry_run or unit_tests is None:
        raise Skip("needs a GPU and the bundle's nereid-gpu tests")
    with open(unit_tests) as out:
        text = out.read()
    summary = [line for line in text.splitlines() if line.startswith(("test ", "staged "))]
    # The staging test takes its device branch only where a GPU is visible.
    on_device = any(line.startswith("staged ") for line in summary)
    check.record(
        "device batch staging (nereid-gpu's tests on the device)",
        "pass" if unit_status == 0 and on_device else "fail",
        ran_on_a_device=on_device,
        exit_status=unit_status,
        tests=summary,
    )


def step_throughput(check, url, seconds):
    """Rows per second through the server against the same model in this
    process at its best batch, in the same run."""
    if check.dry_run:
        raise Skip("needs a GPU")
    np, torch = torch_or_skip()
    device = torch.device("cuda", 0)
    module, w, b = reference(device)
    best = {}
    for batch in (1, 8, 32, 64):
        x = torch.randn(batch, 1024)
        deadline = time.monotonic() + seconds / 4
        rows = 0
        while time.monotonic() < deadline:
            module.forward(x.to(device), w, b).cpu()
            rows += batch
        best[batch] = rows / (seconds / 4)
    in_process = max(best.values())
    host, port = url.split("//", 1)[1].split(":")
    payload = np.random.default_rng(1).standard_normal((1, 1024), dtype=np.float32).tobytes()
    counts = [0] * 32
    stop = time.monotonic() + seconds

    def worker(i):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        while time.monotonic() < stop:
            infer_binary(connection, "torch_mlp", 1, 1024, payload)
            counts[i] += 1
        connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(counts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 60)
    served = sum(counts) / seconds
    check.record(
        "throughput: server against in-process torch",
        "pass",
        server_rows_per_s=round(served),
        in_process_rows_per_s={k: round(v) for k, v in best.items()},
        ratio_to_best=round(served / in_process, 3),
        client_threads=len(counts),
        note="one row per request; the server's figure includes HTTP and the Python stub",
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--report", required=True)
    parser.add_argument("--unit-tests", help="nereid-gpu's test output on the device")
    parser.add_argument("--unit-status", type=int, default=None)
    args = parser.parse_args()
    check = Check(args.http, args.metrics, args.dry_run)
    check.run("placement", lambda: step_placement(check))
    check.run("GPU metrics", lambda: step_metrics(check))
    check.run("torch through dynamic batching", lambda: step_torch_batching(check, args.http))
    check.run("CUDA shared memory", lambda: step_cuda_shared_memory(check))
    check.run("device batch assembly", lambda: step_device_batches(check, args.unit_tests, args.unit_status))
    check.run("throughput", lambda: step_throughput(check, args.http, args.seconds))
    with open(args.report, "w") as out:
        json.dump({"dry_run": args.dry_run, "steps": check.steps}, out, indent=2)
    failed = [s["step"] for s in check.steps if s["outcome"] == "fail"]
    print(f"{len(check.steps)} steps, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
