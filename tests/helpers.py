"""Shared helpers for the Nereid end-to-end tests.

Everything here talks to 127.0.0.1 only and every network call is bounded by
TIMEOUT seconds.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
EXAMPLES_MODELS = REPO_ROOT / "examples" / "models"
DEFAULT_SERVER_BIN = REPO_ROOT / "target" / "debug" / "nereid-server"

HOST = "127.0.0.1"
# Bound on every single HTTP / gRPC call made by the tests.
TIMEOUT = 10.0
# Bound on server start-up (ports announced + ready).
STARTUP_TIMEOUT = 60.0
# Bound on graceful shutdown after SIGTERM.
SHUTDOWN_TIMEOUT = 30.0

ALL_EXAMPLE_MODELS = (
    "accumulate_int32", "identity", "identity_bytes", "identity_fp16", "mlp_small", "repeat_int32", "simple",
    "simple_string",
)

# Limits of the `small_server` fixture.
SMALL_HTTP_MAX_INPUT = 4096
SMALL_GRPC_MAX_MESSAGE = 65536

# Expected index state of each model of the `broken_repo_server` fixture.
BROKEN_REPO_MODELS = {
    "simple": "READY",
    "auto_simple": "READY",  # only 1/model.onnx, config auto-completed
    "bad_syntax": "UNAVAILABLE",  # config.pbtxt does not parse
    "bad_dtype": "UNAVAILABLE",  # config says INPUT0 is TYPE_FP32, the ONNX file says INT32
}

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HTTP_RE = re.compile(r"Started HTTPService at ([0-9.]+):(\d+)")
_GRPC_RE = re.compile(r"Started GRPCInferenceService at ([0-9.]+):(\d+)")
_METRICS_RE = re.compile(r"Started Metrics Service at ([0-9.]+):(\d+)")


# --------------------------------------------------------------------------
# Environment discovery
# --------------------------------------------------------------------------


def proc_status_value(pid: int, field: str) -> int:
    """The number of a /proc/<pid>/status field, as written (kB for memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def proc_status(pid: int, field: str) -> int:
    """A /proc/<pid>/status memory field, in bytes."""
    return proc_status_value(pid, field) * 1024


def reset_peak_rss(pid: int) -> int:
    """Resets the process's peak RSS (VmHWM) to its current RSS and returns it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return proc_status(pid, "VmHWM")


def server_binary() -> Path:
    """The nereid-server binary: $NEREID_SERVER_BIN or target/debug/nereid-server.

    Fails the requesting test (never skips) when the binary is missing.
    """
    env = os.environ.get("NEREID_SERVER_BIN")
    path = Path(env) if env else DEFAULT_SERVER_BIN
    if not path.is_file():
        origin = "NEREID_SERVER_BIN" if env else "default location"
        pytest.fail(
            f"nereid-server binary not found at {path} ({origin}). "
            "Build it with `cargo build -p nereid-server` or point NEREID_SERVER_BIN at it.",
            pytrace=False,
        )
    if not os.access(path, os.X_OK):
        pytest.fail(f"nereid-server binary at {path} is not executable", pytrace=False)
    return path


def find_ort_dylib() -> str | None:
    """libonnxruntime.so.* shipped inside the onnxruntime wheel, if any."""
    try:
        import onnxruntime
    except ImportError:
        return None
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    candidates = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so.*")))
    return candidates[-1] if candidates else None


def ensure_ort_dylib_env() -> str | None:
    """Set ORT_DYLIB_PATH from the venv's onnxruntime when the caller did not."""
    if not os.environ.get("ORT_DYLIB_PATH"):
        found = find_ort_dylib()
        if found:
            os.environ["ORT_DYLIB_PATH"] = found
    return os.environ.get("ORT_DYLIB_PATH")


# --------------------------------------------------------------------------
# Server process management
# --------------------------------------------------------------------------

_LIVE_SERVERS: list["NereidServer"] = []


@atexit.register
def _kill_leftovers() -> None:
    # Backstop only: fixtures stop their servers gracefully. This kills (by
    # our own Popen handle) anything a crashed test session left behind.
    for server in list(_LIVE_SERVERS):
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            try:
                server.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class NereidServer:
    """One nereid-server process on ephemeral 127.0.0.1 ports."""

    def __init__(
        self,
        repos: Sequence[Path],
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        wait_for: str = "ready",
        env: dict[str, str] | None = None,
    ) -> None:
        # Local folders as paths; URLs (s3://...) kept as written.
        self.repos = [r if isinstance(r, str) and "://" in r else Path(r) for r in repos]
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.log_path = log_path
        self.wait_for = wait_for  # "ready", "live" or "ports"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._ports_found = threading.Event()
        self._eof = threading.Event()
        self._reader: threading.Thread | None = None
        self._log_file = None

    # -- properties --------------------------------------------------------

    @property
    def http_url(self) -> str:
        """host:port form, as tritonclient.http expects."""
        return f"{HOST}:{self.http_port}"

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [str(server_binary())]
        for repo in self.repos:
            cmd += ["--model-repository", str(repo)]
        cmd += [
            "--http-address", HOST, "--http-port", "0",
            "--grpc-address", HOST, "--grpc-port", "0",
            "--metrics-address", HOST, "--metrics-port", "0",
        ]
        cmd += self.extra_args
        return cmd

    def output(self, last: int | None = None) -> str:
        with self._lock:
            lines = self._lines if last is None else self._lines[-last:]
            return "\n".join(lines)

    def describe(self, headline: str) -> str:
        rc = self.proc.poll() if self.proc else None
        where = f" (full log: {self.log_path})" if self.log_path else ""
        return (
            f"{headline}\ncommand: {' '.join(self.command())}\n"
            f"pid: {self.pid}, exit code: {rc}{where}\n"
            f"ORT_DYLIB_PATH: {os.environ.get('ORT_DYLIB_PATH') or '(unset)'}\n"
            f"---- server output (last 200 lines) ----\n{self.output(200)}\n"
            "---- end of server output ----"
        )

    # -- lifecycle ---------------------------------------------------------

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = _ANSI_RE.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r\n")
            with self._lock:
                self._lines.append(line)
            if self._log_file is not None:
                self._log_file.write(line + "\n")
                self._log_file.flush()
            if self.http_port is None:
                m = _HTTP_RE.search(line)
                if m:
                    self.http_port = int(m.group(2))
            if self.grpc_port is None:
                m = _GRPC_RE.search(line)
                if m:
                    self.grpc_port = int(m.group(2))
            if self.metrics_port is None:
                m = _METRICS_RE.search(line)
                if m:
                    self.metrics_port = int(m.group(2))
            if self.http_port is not None and self.grpc_port is not None:
                self._ports_found.set()
        self._eof.set()

    def start(self) -> "NereidServer":
        cmd = self.command()
        env = dict(os.environ)
        # Python models run on the test's interpreter (numpy is there), as
        # they would with its virtual environment activated.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.env)
        env.setdefault("NO_COLOR", "1")
        ort = ensure_ort_dylib_env()
        if ort:
            env["ORT_DYLIB_PATH"] = ort
        if self.log_path is not None:
            self._log_file = open(self.log_path, "w", encoding="utf-8")
            self._log_file.write("$ " + " ".join(cmd) + "\n")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO_ROOT),
            # Own process group: a Ctrl-C aimed at pytest must not reach the
            # server before the fixture's graceful SIGTERM does.
            start_new_session=True,
        )
        _LIVE_SERVERS.append(self)
        self._reader = threading.Thread(target=self._read_output, name=f"nereid-{self.proc.pid}", daemon=True)
        self._reader.start()

        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._ports_found.wait(timeout=0.05):
            if self.proc.poll() is not None:
                self._eof.wait(timeout=2)
                self._fail_start("nereid-server exited before announcing its ports")
            if time.monotonic() > deadline:
                self._fail_start(
                    f"nereid-server did not log both 'Started HTTPService at {HOST}:PORT' and "
                    f"'Started GRPCInferenceService at {HOST}:PORT' within {STARTUP_TIMEOUT:.0f} s"
                )

        if self.wait_for == "ports":
            # The ports are announced after start-up loading: enough for a
            # caller that checks readiness its own way (over TLS, say).
            return self
        path = "/v2/health/ready" if self.wait_for == "ready" else "/v2/health/live"
        last = "no response"
        while True:
            if self.proc.poll() is not None:
                self._fail_start(f"nereid-server exited while waiting for {path}")
            try:
                r = requests.get(self.base_url + path, timeout=2)
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except requests.RequestException as exc:  # not accepting yet
                last = repr(exc)
            if time.monotonic() > deadline:
                self._fail_start(f"{path} did not return 200 within {STARTUP_TIMEOUT:.0f} s (last: {last})")
            time.sleep(0.1)
        return self

    def _fail_start(self, headline: str) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._eof.wait(timeout=2)
        self._close_log()
        pytest.fail(self.describe(headline), pytrace=False)

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            finally:
                self._log_file = None

    def stop(self) -> int:
        """SIGTERM, wait up to SHUTDOWN_TIMEOUT, return the exit code.

        Kills the process only when it hangs, and then fails.
        """
        assert self.proc is not None
        try:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=SHUTDOWN_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
                    self._eof.wait(timeout=2)
                    pytest.fail(
                        self.describe(f"nereid-server did not exit within {SHUTDOWN_TIMEOUT:.0f} s of SIGTERM; killed"),
                        pytrace=False,
                    )
            self._eof.wait(timeout=5)
            return self.proc.returncode
        finally:
            if self in _LIVE_SERVERS:
                _LIVE_SERVERS.remove(self)
            self._close_log()

    def stop_and_check(self) -> None:
        rc = self.stop()
        if rc != 0:
            pytest.fail(
                self.describe(f"nereid-server did not shut down gracefully on SIGTERM: exit code {rc}"),
                pytrace=False,
            )


# --------------------------------------------------------------------------
# Plain-HTTP helpers (requests, for exact status codes and malformed bodies)
# --------------------------------------------------------------------------


def launch(tmp_path_factory, name: str, repos, args, wait_for: str = "ready") -> NereidServer:
    """Starts a server whose log is `<name>.log` in a fresh pytest folder."""
    server_binary()  # fail early and clearly when the binary is missing
    log_dir = tmp_path_factory.mktemp("logs", numbered=True)
    return NereidServer(repos, args, log_path=log_dir / f"{name}.log", wait_for=wait_for).start()


def private_repo(tmp_path_factory, name: str) -> Path:
    """A copy of examples/models that the test may change."""
    repo = tmp_path_factory.mktemp(name) / "models"
    shutil.copytree(EXAMPLES_MODELS, repo)
    return repo


def http_get(server: NereidServer, path: str, **kw: Any) -> requests.Response:
    kw.setdefault("timeout", TIMEOUT)
    return requests.get(server.base_url + path, **kw)


def http_post(server: NereidServer, path: str, **kw: Any) -> requests.Response:
    kw.setdefault("timeout", TIMEOUT)
    return requests.post(server.base_url + path, **kw)


def infer_path(model: str, version: str | None = None) -> str:
    if version:
        return f"/v2/models/{model}/versions/{version}/infer"
    return f"/v2/models/{model}/infer"


def post_infer(
    server: NereidServer,
    model: str,
    body: bytes | str | dict,
    headers: dict | None = None,
    version: str | None = None,
) -> requests.Response:
    if isinstance(body, dict):
        data = json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"}
    else:
        data = body.encode() if isinstance(body, str) else body
        hdrs = {}
    hdrs.update(headers or {})
    return http_post(server, infer_path(model, version), data=data, headers=hdrs)


def error_message(resp: requests.Response) -> str:
    """The "error" string of a Triton-style JSON error body (asserting its shape)."""
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(
            f"error response is not JSON: HTTP {resp.status_code}, body {resp.content[:300]!r}"
        ) from None
    assert isinstance(body, dict) and isinstance(body.get("error"), str), (
        f"error response lacks an 'error' string: HTTP {resp.status_code}, body {body!r}"
    )
    assert body["error"].strip(), f"empty error message: {body!r}"
    return body["error"]


def assert_http_error(
    resp: requests.Response,
    status: int | Iterable[int] = 400,
    contains: Iterable[str] = (),
) -> str:
    allowed = {status} if isinstance(status, int) else set(status)
    assert resp.status_code in allowed, (
        f"expected HTTP {sorted(allowed)}, got {resp.status_code}: {resp.content[:500]!r}"
    )
    msg = error_message(resp)
    for needle in contains:
        assert needle in msg, f"error message {msg!r} does not mention {needle!r}"
    return msg


def assert_setting_refused(server: NereidServer, path: str, change: dict, needle: str) -> None:
    """A bad settings POST is a 400 naming `needle`, changes nothing, and the server keeps serving."""
    before = http_get(server, path).json()
    assert_http_error(http_post(server, path, json=change), 400, contains=[needle])
    assert http_get(server, path).json() == before
    assert_simple_works(server)


def binary_body(header: dict, blobs: Sequence[bytes] = ()) -> tuple[bytes, dict]:
    """Body and headers for a request in the binary tensor data extension."""
    head = json.dumps(header).encode()
    body = head + b"".join(blobs)
    headers = {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }
    return body, headers


def encode_bytes_elements(elements: Iterable[bytes]) -> bytes:
    """Triton BYTES serialization: 4-byte little-endian length + raw bytes each."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def decode_bytes_elements(buf: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(buf):
        assert pos + 4 <= len(buf), "truncated BYTES length prefix in response"
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        assert pos + n <= len(buf), "truncated BYTES element in response"
        out.append(buf[pos:pos + n])
        pos += n
    return out


_NP_DTYPES = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}


def parse_infer_response(resp: requests.Response) -> tuple[dict, dict[str, Any]]:
    """Decode a successful /infer response (JSON or binary extension).

    Returns (header_json, {output_name: numpy array or list[bytes] for BYTES}).
    """
    assert resp.status_code == 200, f"HTTP {resp.status_code}: {resp.content[:500]!r}"
    content = resp.content
    hlen = resp.headers.get("Inference-Header-Content-Length")
    if hlen is not None:
        n = int(hlen)
        header, rest = json.loads(content[:n]), content[n:]
    else:
        header, rest = json.loads(content), b""
    outputs: dict[str, Any] = {}
    pos = 0
    for out in header.get("outputs", []):
        name, dtype, shape = out["name"], out["datatype"], out["shape"]
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = rest[pos:pos + size]
            assert len(raw) == size, f"binary output {name} truncated"
            pos += size
            if dtype == "BYTES":
                outputs[name] = decode_bytes_elements(raw)
            else:
                outputs[name] = np.frombuffer(raw, dtype=_NP_DTYPES[dtype]).reshape(shape)
        else:
            data = out["data"]
            if dtype == "BYTES":
                outputs[name] = [d.encode("utf-8") if isinstance(d, str) else d for d in data]
            else:
                outputs[name] = np.array(data, dtype=_NP_DTYPES[dtype]).reshape(shape)
    assert pos == len(rest), f"{len(rest) - pos} unexplained trailing bytes in binary response"
    return header, outputs


# --------------------------------------------------------------------------
# The `simple` model
# --------------------------------------------------------------------------


def simple_inputs(batch: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-10_000, 10_000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-10_000, 10_000, size=(batch, 16), dtype=np.int32)
    return a, b


def simple_http_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True):
    """The simple model's two inputs for tritonclient.http, holding `a` and `b`."""
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def simple_json_request(a: np.ndarray, b: np.ndarray, outputs: Sequence[str] | None = None) -> dict:
    req: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": list(a.shape), "data": a.flatten().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": list(b.shape), "data": b.flatten().tolist()},
        ]
    }
    if outputs is not None:
        req["outputs"] = [{"name": n} for n in outputs]
    return req


def check_simple_outputs(outputs: dict, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(np.asarray(outputs["OUTPUT0"]), a + b)
    np.testing.assert_array_equal(np.asarray(outputs["OUTPUT1"]), a - b)


def assert_simple_works(server: NereidServer, model: str = "simple", batch: int = 2) -> None:
    """A valid JSON inference on `simple`: the server still serves correctly."""
    a, b = simple_inputs(batch, seed=1234)
    resp = post_infer(server, model, simple_json_request(a, b))
    assert resp.status_code == 200, (
        f"valid follow-up request failed: HTTP {resp.status_code}: {resp.content[:500]!r}"
    )
    header, outputs = parse_infer_response(resp)
    assert header["model_name"] == model
    check_simple_outputs(outputs, a, b)


# --------------------------------------------------------------------------
# Repository helpers
# --------------------------------------------------------------------------


def repository_index(server: NereidServer, body: dict | None = None) -> dict[str, dict]:
    """POST /v2/repository/index -> {model_name: entry}."""
    resp = http_post(server, "/v2/repository/index", data=json.dumps(body) if body else b"")
    assert resp.status_code == 200, f"index failed: HTTP {resp.status_code}: {resp.content[:500]!r}"
    entries = resp.json()
    assert isinstance(entries, list), entries
    by_name: dict[str, dict] = {}
    for entry in entries:
        assert isinstance(entry, dict) and "name" in entry, entry
        # One model may appear once per version; keep the READY one if any.
        prev = by_name.get(entry["name"])
        if prev is None or entry.get("state") == "READY":
            by_name[entry["name"]] = entry
    return by_name


def wait_for_index(server: NereidServer, predicate, timeout: float = 30.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        index = repository_index(server)
        if predicate(index):
            return index
        if time.monotonic() > deadline:
            raise AssertionError(f"repository index never reached the expected state: {index}")
        time.sleep(0.1)


def simple_config_json(name: str = "simple", max_batch_size: int = 8, input_type: str = "TYPE_INT32") -> dict:
    """Triton model config (protobuf JSON names) equivalent to simple/config.pbtxt."""
    def tensor(n: str, t: str) -> dict:
        return {"name": n, "data_type": t, "dims": [16]}

    return {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [tensor("INPUT0", input_type), tensor("INPUT1", "TYPE_INT32")],
        "output": [tensor("OUTPUT0", "TYPE_INT32"), tensor("OUTPUT1", "TYPE_INT32")],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }


def simple_config_pbtxt(name: str, input0_type: str = "TYPE_INT32") -> str:
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {input0_type} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
"""


def broken_syntax_pbtxt(name: str) -> str:
    """A config.pbtxt with a syntax error (unterminated message and list)."""
    return (
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        "max_batch_size: 8\n"
        "input [\n"
        '  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ]\n'
    )


def make_model_dir(repo: Path, name: str, config: str | None, onnx_from: str = "simple") -> Path:
    """Create repo/name/1/model.onnx (copied from an example) and optionally config.pbtxt."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    src = EXAMPLES_MODELS / onnx_from / "1" / "model.onnx"
    (model_dir / "1" / "model.onnx").write_bytes(src.read_bytes())
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """relu(x @ W1 + b1) @ W2 + b2 with the weights stored in mlp_small's ONNX file."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(EXAMPLES_MODELS / "mlp_small" / "1" / "model.onnx"))
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    h = np.maximum(x.astype(np.float64) @ w["W1"] + w["b1"], 0.0)
    return (h @ w["W2"] + w["b2"]).astype(np.float32)
