"""Checks of the Python stub against a fake host that speaks
docs/python-backend.md's protocol: `.venv/bin/python -m pytest python/stub/tests -q`."""

import array
import collections
import json
import mmap
import os
import queue
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

STUB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(STUB_DIR, "nereid_stub.py")
DTYPES = {"FP32": "<f4", "INT32": "<i4", "INT64": "<i8", "UINT8": "u1", "BOOL": "?", "FP64": "<f8"}


def serialize_bytes(items):
    out = b""
    for b in items:
        out += struct.pack("<I", len(b)) + b
    return out


def parse_bytes(data, count):
    out, pos = [], 0
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, pos)
        out.append(bytes(data[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return out


class FakeHost:
    """The server's side: two socket pairs, the host pool (a bump allocator
    over one segment), and a reader thread queueing the stub's messages."""

    def __init__(self, tmp_path, source, config=None, shm=None, bls=None, op="init"):
        self.hsize = 1 << 20
        # One segment, announced with its descriptor before init.
        self.hfd = os.memfd_create("nereid-test-h0", os.MFD_CLOEXEC)
        os.ftruncate(self.hfd, self.hsize)
        self.hmm = mmap.mmap(self.hfd, self.hsize)
        self.hhead = 0
        self.smaps = {}
        self.rbuf = bytearray()
        self.fds = collections.deque()
        self.bls = bls  # callable(host, msg) answering bls calls
        self.msgs = queue.Queue()
        model_dir = tmp_path / "m" / "1"
        model_dir.mkdir(parents=True, exist_ok=True)
        self.model_file = str(model_dir / "model.py")
        if source is not None:
            with open(self.model_file, "w") as f:
                f.write(textwrap.dedent(source))
        self.config = config or {"name": "m", "max_batch_size": 0, "input": [], "output": []}
        self.shm = dict(default_byte_size=1 << 20, growth_byte_size=1 << 20, limit_byte_size=1 << 30)
        self.shm.update(shm or {})
        # One socket pair each way, as the server makes them: `sock` takes
        # frames to the stub, `rsock` brings its own.
        self.sock, child_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.rsock, child_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (child_in.fileno(), child_out.fileno())
        # The server passes fds 3 and 4; any numbers do, the stub reads them from the environment.
        env = dict(os.environ, NEREID_STUB_FD=str(fds[0]), NEREID_STUB_OUT_FD=str(fds[1]), PYTHONPATH=STUB_DIR)
        self.proc = subprocess.Popen([sys.executable, STUB], env=env, pass_fds=fds, stderr=subprocess.PIPE)
        child_in.close()
        child_out.close()
        self.stderr = []
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._reader, daemon=True).start()
        self.wlock = threading.Lock()

    # -- plumbing

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    def _recv_exact(self, n):
        while len(self.rbuf) < n:
            try:
                chunk, ancillary, _, _ = self.rsock.recvmsg(65536, socket.CMSG_SPACE(64))
            except OSError:
                return None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                    self.fds.extend(fds)
            if not chunk:
                return None
            self.rbuf += chunk
        data = bytes(self.rbuf[:n])
        del self.rbuf[:n]
        return data

    def _reader(self):
        while True:
            head = self._recv_exact(4)
            if head is None:
                self.msgs.put(None)
                return
            msg = json.loads(self._recv_exact(struct.unpack("<I", head)[0]))
            if msg.get("op") == "segment":
                # The stub's new segment: mapped before any message names it.
                fd = self.fds.popleft()
                self.smaps[msg["seg"]] = mmap.mmap(fd, os.fstat(fd).st_size)
                os.close(fd)
                continue
            if msg.get("op") == "bls" and self.bls is not None:
                threading.Thread(target=self.bls, args=(self, msg), daemon=True).start()
                continue
            self.msgs.put(msg)

    def send(self, msg, fd=None):
        data = json.dumps(msg).encode()
        frame = struct.pack("<I", len(data)) + data
        with self.wlock:
            if fd is None:
                self.sock.sendall(frame)
            else:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                assert self.sock.sendmsg([frame], rights) == len(frame)

    def recv(self, timeout=10):
        try:
            return self.msgs.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message from the stub; stderr:\n" + "".join(self.stderr))

    def expect(self, op, timeout=10):
        for k, m in enumerate(self.side or ()):
            if m["op"] == op:
                return self.side.pop(k)
        while True:
            msg = self.recv(timeout)
            assert msg is not None, "the stub closed its socket; stderr:\n" + "".join(self.stderr)
            if msg["op"] == op:
                return msg
            if msg["op"] in ("log", "metric_family", "metric", "metric_update"):
                self.side.append(msg)
                continue
            raise AssertionError("expected %s, got %s" % (op, msg))

    side = None

    def start(self, expect="ready"):
        self.side = []
        if expect is None:
            return
        args = {
            "model_config": json.dumps(self.config),
            "model_instance_kind": "CPU",
            "model_instance_name": "m_0",
            "model_instance_device_id": "0",
            "model_repository": os.path.dirname(os.path.dirname(self.model_file)),
            "model_version": "1",
            "model_name": "m",
        }
        self.send({"op": "segment", "seg": 0}, self.hfd)
        self.send({"op": "init", "model_file": self.model_file, "args": args, "shm": self.shm})
        return self.expect(expect)

    # -- host pool

    def put(self, name, array, datatype=None):
        """A host descriptor for `array` in a new live block."""
        if datatype == "BYTES":
            data = serialize_bytes(list(array.flat))
            shape = list(array.shape)
        else:
            datatype = datatype or {v: k for k, v in DTYPES.items()}[np.dtype(array.dtype).str.replace("|", "")]
            data = np.ascontiguousarray(array).tobytes()
            shape = list(array.shape)
        if not data:
            return {"name": name, "datatype": datatype, "shape": shape, "seg": -1, "off": 0, "len": 0}
        block = self.hhead
        need = (16 + len(data) + 63) & ~63
        assert block + need <= self.hsize
        self.hhead += need
        struct.pack_into("<IIQ", self.hmm, block, 1, 0, len(data))
        self.hmm[block + 16 : block + 16 + len(data)] = data
        return {"name": name, "datatype": datatype, "shape": shape, "seg": 0, "off": block + 16, "len": len(data)}

    def host_state(self, desc):
        return struct.unpack_from("<I", self.hmm, desc["off"] - 16)[0]

    def smap(self, seg):
        return self.smaps[seg]

    def get(self, desc, free=True):
        """The array of a stub descriptor (a copy); frees its block."""
        shape = desc["shape"]
        if desc["seg"] < 0:
            data = b""
        else:
            mm = self.smap(desc["seg"])
            state, _, n = struct.unpack_from("<IIQ", mm, desc["off"] - 16)
            assert state == 1 and n == desc["len"], (state, n, desc)
            data = bytes(mm[desc["off"] : desc["off"] + desc["len"]])
            if free:
                struct.pack_into("<I", mm, desc["off"] - 16, 2)
        if desc["datatype"] == "BYTES":
            count = int(np.prod(shape)) if shape else 1
            return np.array(parse_bytes(data, count), dtype=object).reshape(shape)
        return np.frombuffer(data, dtype=DTYPES[desc["datatype"]]).reshape(shape).copy()

    def execute(self, requests):
        reqs = []
        for i, r in enumerate(requests):
            r = dict(r)
            r.setdefault("id", "r%d" % i)
            r.setdefault("correlation_id", 0)
            r.setdefault("flags", 0)
            r.setdefault("requested_outputs", [])
            r.setdefault("parameters", {})
            r.setdefault("timeout_us", 0)
            reqs.append(r)
        self.send({"op": "execute", "requests": reqs})

    def close(self):
        try:
            for sock in (self.sock, self.rsock):
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.hfd)


@pytest.fixture
def host_factory(tmp_path):
    hosts = []

    def make(*args, **kwargs):
        h = FakeHost(tmp_path, *args, **kwargs)
        hosts.append(h)
        return h

    yield make
    for h in hosts:
        h.close()


ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        c = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(c["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ], parameters={"p": request.parameters()}))
        return responses
"""

ADD_SUB_CONFIG = {
    "name": "add_sub",
    "max_batch_size": 0,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
}


def test_add_sub_frees_inputs_and_reuses_its_ring(host_factory):
    h = host_factory(ADD_SUB, config=ADD_SUB_CONFIG, shm={"default_byte_size": 4096})
    h.start()
    for round in range(200):
        a = np.arange(4, dtype=np.float32) + round
        b = np.ones(4, dtype=np.float32)
        descs = [h.put("INPUT0", a), h.put("INPUT1", b), h.put("INPUT0", b), h.put("INPUT1", a)]
        if h.hhead > h.hsize // 2:
            h.hhead = 0
        h.execute(
            [
                {"inputs": descs[:2], "parameters": {"k": "v", "n": 3}},
                {"inputs": descs[2:], "requested_outputs": ["OUTPUT1"]},
            ]
        )
        msg = h.expect("executed")
        assert msg["error"] is None
        r0, r1 = msg["responses"]
        assert [d["name"] for d in r0["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(h.get(r0["outputs"][0]), a + b)
        np.testing.assert_array_equal(h.get(r0["outputs"][1]), a - b)
        assert json.loads(r0["parameters"]["p"]) == {"k": "v", "n": 3}
        # Every output goes back; the server keeps the requested ones.
        assert [d["name"] for d in r1["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(h.get(r1["outputs"][0]), a + b)
        np.testing.assert_array_equal(h.get(r1["outputs"][1]), b - a)
        for d in descs:
            assert h.host_state(d) == 2, "an input block was not freed"
    # 200 rounds of 4 blocks of 80 bytes went through a 4 KiB ring: no growth.
    assert list(h.smaps) == [0]
    h.send({"op": "finalize"})
    h.expect("finalized")
    assert h.proc.wait(timeout=10) == 0


def test_input_kept_alive_by_the_model(host_factory):
    src = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        kept = None
        def execute(self, requests):
            out = []
            for r in requests:
                x = r.inputs()[0].as_numpy()
                if r.parameters() == '{"keep": true}':
                    self.kept = x[1:]      # a view of a view
                elif r.parameters() == '{"drop": true}':
                    self.kept = None
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
            return out
    """
    h = host_factory(src)
    h.start()
    d1 = h.put("X", np.arange(6, dtype=np.int64))
    h.execute([{"inputs": [d1], "parameters": {"keep": True}}])
    msg = h.expect("executed")
    np.testing.assert_array_equal(h.get(msg["responses"][0]["outputs"][0]), np.arange(6) * 2)
    assert h.host_state(d1) == 1, "a kept input was freed"
    d2 = h.put("X", np.arange(3, dtype=np.int64))
    h.execute([{"inputs": [d2]}])
    h.expect("executed")
    assert h.host_state(d1) == 1 and h.host_state(d2) == 2
    d3 = h.put("X", np.arange(3, dtype=np.int64))
    h.execute([{"inputs": [d3], "parameters": {"drop": True}}])
    h.expect("executed")
    assert h.host_state(d1) == 2 and h.host_state(d3) == 2


DECOUPLED_REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        assert pb_utils.using_decoupled_model_transaction_policy(__import__("json").loads(args["model_config"]))

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,)).start()
        return None

    def run(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        sender = request.get_response_sender()
        del request
        for v in x:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([]))
        except pb_utils.TritonModelException as e:
            pb_utils.Logger.log_warn("refused: " + str(e))
"""


def test_decoupled_repeat_from_threads(host_factory):
    config = {"name": "repeat", "input": [], "output": [], "model_transaction_policy": {"decoupled": True}}
    h = host_factory(DECOUPLED_REPEAT, config=config)
    h.start()
    da = h.put("IN", np.array([4, 5, 6], dtype=np.int32))
    db = h.put("IN", np.array([7, 8], dtype=np.int32))
    h.execute([{"inputs": [da]}, {"inputs": [db]}])
    got = {0: [], 1: []}
    finals = set()
    executed = False
    logs = []
    while len(finals) < 2 or not executed or len(logs) < 2:
        m = h.recv()
        if m["op"] == "executed":
            assert m["error"] is None and "responses" not in m
            executed = True
        elif m["op"] == "response":
            i = m["request"]
            assert i not in finals
            if m["flags"] == 1:
                assert m["response"] is None
                finals.add(i)
            else:
                got[i].append(int(h.get(m["response"]["outputs"][0])[0]))
        elif m["op"] == "log":
            logs.append(m)
        else:
            raise AssertionError(m)
    assert got == {0: [4, 5, 6], 1: [7, 8]}
    assert all(l["level"] == "WARNING" and "already sent its final" in l["message"] for l in logs)
    assert logs[0]["file"].endswith("model.py") and logs[0]["line"] > 0
    # A sender's thread drops its input after its final send returns: the
    # blocks are freed when those threads end, a moment after the finals.
    deadline = time.monotonic() + 10
    while (h.host_state(da), h.host_state(db)) != (2, 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert h.host_state(da) == 2 and h.host_state(db) == 2


def test_execute_errors(host_factory):
    src = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            mode = requests[0].request_id()
            if mode == "raise":
                return helper()
            if mode == "none":
                return None
            if mode == "short":
                return [pb_utils.InferenceResponse([])] * (len(requests) - 1)
            if mode == "wrongtype":
                return ["x"] * len(requests)
            if mode == "bad-dtype":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", __import__("numpy").array([1j]))])]
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND))
                    for r in requests]

    def helper():
        return 1 / 0
    """
    h = host_factory(src)
    h.start()
    h.execute([{"id": "raise"}])
    err = h.expect("executed")["error"]
    assert err["code"] == "INTERNAL"
    assert err["message"].startswith("ZeroDivisionError: division by zero")
    assert "return 1 / 0" in err["message"] and "in helper" in err["message"]
    h.execute([{"id": "none"}, {}])
    m = h.expect("executed")
    assert m["responses"] == [] and "execute returned None for 2 requests" in m["error"]["message"]
    h.execute([{"id": "short"}, {}, {}])
    assert "execute returned 2 responses for 3 requests" in h.expect("executed")["error"]["message"]
    h.execute([{"id": "wrongtype"}])
    assert "not a pb_utils.InferenceResponse" in h.expect("executed")["error"]["message"]
    h.execute([{"id": "bad-dtype"}])
    assert "no Triton datatype" in h.expect("executed")["error"]["message"]
    h.execute([{"id": "e"}, {}])
    m = h.expect("executed")
    assert m["error"] is None
    assert [r["error"] for r in m["responses"]] == [{"message": "nope", "code": "NOT_FOUND"}] * 2
    # The stub still serves after all that.
    h.execute([{"id": "e"}])
    assert h.expect("executed")["error"] is None


@pytest.mark.parametrize(
    "source, needle",
    [
        (None, "does not exist"),
        ("def f(:\n    pass\n", "SyntaxError"),
        ("x = 1\n", "defines no class TritonPythonModel"),
        ("import no_such_module_here\n", "ModuleNotFoundError"),
        ("class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('bad arg')\n", "ValueError: bad arg"),
    ],
)
def test_init_failures(host_factory, source, needle):
    h = host_factory(source)
    m = h.start(expect="failed")
    assert needle in m["message"], m["message"]
    assert h.proc.wait(timeout=10) == 1


BLS_MODEL = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    {define} execute(self, requests):
        out = []
        for request in requests:
            x = request.inputs()[0]
            mode = request.request_id()
            if mode == "sync":
                r = pb_utils.InferenceRequest(model_name="double", inputs=[x], requested_output_names=["Y"],
                                              parameters={{"a": 1}}).exec()
                out.append(r if r.has_error() else pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.output_tensors()[0].as_numpy() + 1)]))
            elif mode == "stream":
                rs = list(pb_utils.InferenceRequest(model_name="stream", inputs=[x]).exec(decoupled=True))
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.concatenate([pb_utils.get_output_tensor_by_name(r, "Y").as_numpy() for r in rs]))]))
            elif mode == "missing":
                r = pb_utils.InferenceRequest(model_name="missing", inputs=[x]).exec()
                out.append(pb_utils.InferenceResponse(error=r.error()))
            {async_branch}
        return out
"""

ASYNC_BRANCH = """elif mode == "async":
                reqs = [pb_utils.InferenceRequest(model_name="double", inputs=[x]) for _ in range(3)]
                rs = await asyncio.gather(*[q.async_exec() for q in reqs])
                rs2 = await pb_utils.InferenceRequest(model_name="stream", inputs=[x]).async_exec(decoupled=True)
                total = sum(r.output_tensors()[0].as_numpy() for r in rs) + sum(r.output_tensors()[0].as_numpy() for r in rs2)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total)]))"""


def answer_bls(h, msg):
    x = h.get(msg["inputs"][0]) if msg["inputs"] else None
    if msg["model"] == "double":
        assert msg["decoupled"] is False
        time.sleep(0.01)
        h.send({"op": "bls_response", "call": msg["call"], "final": True,
                "response": {"outputs": [h.put("Y", x * 2)], "error": None, "parameters": {}}})
    elif msg["model"] == "stream":
        assert msg["decoupled"] is True
        for k in range(3):
            h.send({"op": "bls_response", "call": msg["call"], "final": False,
                    "response": {"outputs": [h.put("Y", x + k)], "error": None, "parameters": {}}})
        h.send({"op": "bls_response", "call": msg["call"], "final": True, "response": None})
    else:
        h.send({"op": "bls_response", "call": msg["call"], "final": True,
                "response": {"outputs": [], "error": {"message": "model 'missing' is not ready", "code": "NOT_FOUND"}, "parameters": {}}})


@pytest.mark.parametrize("define", ["def", "async def"])
def test_bls(host_factory, define):
    h = host_factory(BLS_MODEL.format(define=define, async_branch=ASYNC_BRANCH if define == "async def" else ""), bls=answer_bls)
    h.start()
    x = np.array([1.0, 2.0], dtype=np.float32)
    modes = ["sync", "stream", "missing"] + (["async"] if define == "async def" else [])
    h.execute([{"id": mode, "inputs": [h.put("X", x)]} for mode in modes])
    m = h.expect("executed")
    assert m["error"] is None, m
    rs = m["responses"]
    np.testing.assert_array_equal(h.get(rs[0]["outputs"][0]), x * 2 + 1)
    np.testing.assert_array_equal(h.get(rs[1]["outputs"][0]), np.concatenate([x, x + 1, x + 2]))
    assert rs[2]["error"] == {"message": "model 'missing' is not ready", "code": "NOT_FOUND"}
    if define == "async def":
        np.testing.assert_array_equal(h.get(rs[3]["outputs"][0]), x * 6 + (3 * x + 3))
    # Every BLS output block was given back once the model dropped it.
    off = 0
    while off < h.hhead:
        state, _, n = struct.unpack_from("<IIQ", h.hmm, off)
        assert state == 2, "host block at %d still live" % off
        off += (16 + n + 63) & ~63


def test_pool_growth_and_limit(host_factory):
    src = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(json.loads(r.parameters())["n"], np.uint8))])
                    for r in requests]
    """
    h = host_factory(src, shm={"default_byte_size": 4096, "growth_byte_size": 8192, "limit_byte_size": 4096 + 8192 + 20480})
    h.start()

    def run(n):
        h.execute([{"parameters": {"n": n}}])
        return h.expect("executed")["responses"][0]

    r = run(3000)
    assert r["outputs"][0]["seg"] == 0
    r = run(3000)  # s0 is still held by the first output: grows s1 of 8192
    assert r["outputs"][0]["seg"] == 1 and len(h.smaps[1]) == 8192
    r = run(20000)  # bigger than the growth size: a segment of its size
    assert r["outputs"][0]["seg"] == 2 and len(h.smaps[2]) >= 20016
    r = run(5000)  # fits behind the first block of s1
    assert r["outputs"][0]["seg"] == 1 and r["outputs"][0]["off"] == 3072 + 16
    r = run(6000)
    assert r["outputs"] == [] and "shm-limit-byte-size" in r["error"]["message"]
    # Free s1's blocks: it is reused from its start.
    struct.pack_into("<I", h.smap(1), 0, 2)
    struct.pack_into("<I", h.smap(1), 3072, 2)
    r = run(6000)
    assert r["outputs"][0]["seg"] == 1 and r["outputs"][0]["off"] == 16
    r = run(0)
    assert r["outputs"][0]["seg"] == -1 and r["outputs"][0]["len"] == 0


def test_ring_wraps_with_a_marker(host_factory):
    src = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.full(1000, 7, np.uint8))]) for r in requests]
    """
    h = host_factory(src, shm={"default_byte_size": 4096, "limit_byte_size": 4096})
    h.start()
    offs = []
    for _ in range(3):
        h.execute([{}])
        offs.append(h.expect("executed")["responses"][0]["outputs"][0])
    assert [d["off"] - 16 for d in offs] == [0, 1024, 2048]
    h.get(offs[0])  # frees block 0; 3072..4096 cannot hold 1016+16 bytes... it can: 1024
    h.execute([{}])
    d = h.expect("executed")["responses"][0]["outputs"][0]
    assert d["off"] - 16 == 3072
    h.execute([{}])
    d = h.expect("executed")["responses"][0]["outputs"][0]
    assert d["off"] - 16 == 0  # wrapped to the freed start
    h.get(offs[1])
    h.get(offs[2])
    h.execute([{}])
    d2 = h.expect("executed")["responses"][0]["outputs"][0]
    assert d2["off"] - 16 == 1024
    h.execute([{}])
    r = h.expect("executed")["responses"][0]
    assert r["outputs"][0]["off"] - 16 == 2048
    h.execute([{}])
    r = h.expect("executed")["responses"][0]
    assert "shm-limit-byte-size" in r["error"]["message"]


def test_bytes_cancel_logs_and_metrics(host_factory):
    src = """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.family = pb_utils.MetricFamily("calls", "calls made", pb_utils.MetricFamily.COUNTER)
            self.counter = self.family.Metric(labels={"model": "m"})

        def execute(self, requests):
            out = []
            for r in requests:
                if r.request_id() == "wait":
                    deadline = time.time() + 5
                    while not r.is_cancelled() and time.time() < deadline:
                        time.sleep(0.001)
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("C", np.array([r.is_cancelled()]))]))
                    continue
                s = pb_utils.get_input_tensor_by_name(r, "S").as_numpy()
                self.counter.increment(2)
                pb_utils.Logger.log_info("got %d" % s.size)
                joined = np.array([b"-".join(s.flat), "é"], dtype=object)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("J", joined)],
                    parameters='{"count": %d}' % self.counter.value()))
            return out
    """
    h = host_factory(src)
    h.start()
    fam = h.expect("metric_family")
    met = h.expect("metric")
    assert fam["kind"] == "COUNTER" and met["family"] == fam["family"] and met["labels"] == {"model": "m"}
    d = h.put("S", np.array([[b"a", b"bc"], [b"", b"d"]], dtype=object), "BYTES")
    h.execute([{"inputs": [d]}])
    upd = h.expect("metric_update")
    assert upd == {"op": "metric_update", "metric": met["metric"], "action": "increment", "value": 2.0}
    log = h.expect("log")
    assert log["level"] == "INFO" and log["message"] == "got 4"
    m = h.expect("executed")
    r = m["responses"][0]
    assert r["parameters"] == {"count": 2}
    assert list(h.get(r["outputs"][0])) == [b"a-bc--d", "é".encode()]
    assert h.host_state(d) == 2
    h.execute([{"id": "wait"}])
    time.sleep(0.05)
    h.send({"op": "cancelled", "request": 0})
    m = h.expect("executed")
    assert bool(h.get(m["responses"][0]["outputs"][0])[0]) is True


def test_auto_complete(host_factory):
    src = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(c):
            c.set_max_batch_size(8)
            c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
            c.add_output({"name": "B", "data_type": "FP32", "dims": [-1]})
            c.set_dynamic_batching()
            c.set_model_transaction_policy({"decoupled": True})
            try:
                c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
            except ValueError as e:
                c.as_dict()["parameters"] = {"dup": {"string_value": str(e)}}
            return c
    """
    h = host_factory(src)
    h.start(expect=None)
    h.send({"op": "auto_complete", "model_file": h.model_file, "config": {"name": "m", "max_batch_size": 0, "input": []}})
    c = h.expect("config")["config"]
    assert c["max_batch_size"] == 8
    assert c["input"] == [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}]
    assert c["output"] == [{"name": "B", "data_type": "TYPE_FP32", "dims": [-1]}]
    assert c["dynamic_batching"] == {} and c["model_transaction_policy"] == {"decoupled": True}
    assert "already has an input named 'A'" in c["parameters"]["dup"]["string_value"]
    assert h.proc.wait(timeout=10) == 0


def test_exits_at_end_of_file(host_factory):
    h = host_factory(ADD_SUB, config=ADD_SUB_CONFIG)
    h.start()
    h.sock.shutdown(socket.SHUT_WR)
    assert h.proc.wait(timeout=10) == 0


def test_tensor_api():
    sys.path.insert(0, STUB_DIR)
    import triton_python_backend_utils as pb_utils

    t = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.name() == "x" and t.shape() == [2, 3] and t.is_cpu() and t.triton_dtype() == 11
    u = pb_utils.Tensor.from_dlpack("y", t.to_dlpack())
    np.testing.assert_array_equal(u.as_numpy(), t.as_numpy())
    v = pb_utils.Tensor.from_dlpack("z", t.as_numpy())
    assert v.as_numpy().shape == (2, 3)
    # A bare capsule's device is read without consuming it; a consumed one
    # is refused with a reason rather than crashing the stub.
    capsule = t.to_dlpack()
    assert pb_utils._capsule_device(capsule) == (1, 0)
    np.from_dlpack(pb_utils._DLPackCapsule(capsule))
    with pytest.raises(pb_utils.TritonModelException, match="consumed"):
        pb_utils.Tensor.from_dlpack("w", capsule)
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9 and pb_utils.triton_to_numpy_type(12) is np.float64
    e = pb_utils.TritonError("m")
    assert e.code() == pb_utils.TritonError.INTERNAL and e.message() == "m"
    s = pb_utils.serialize_byte_tensor(np.array([b"ab", "c"], dtype=object))
    assert list(pb_utils.deserialize_bytes_tensor(s)) == [b"ab", b"c"]


def test_decoupled_thread_makes_bls_calls_while_the_main_thread_reads(host_factory):
    src = """
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                threading.Thread(target=self.run, args=(r.inputs()[0], r.get_response_sender())).start()

        def run(self, x, sender):
            for _ in range(20):
                res = pb_utils.InferenceRequest(model_name="double", inputs=[x]).exec()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", res.output_tensors()[0].as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
    config = {"name": "d", "model_transaction_policy": {"decoupled": True}}
    h = host_factory(src, config=config, bls=answer_bls)
    h.start()
    xs = [np.array([float(k)], dtype=np.float32) for k in range(4)]
    h.execute([{"inputs": [h.put("X", x)]} for x in xs])
    counts = [0] * 4
    finals = 0
    executed = False
    while finals < 4 or not executed:
        m = h.recv()
        if m["op"] == "executed":
            assert m["error"] is None
            executed = True
        elif m["flags"] == 1:
            finals += 1
        else:
            i = m["request"]
            np.testing.assert_array_equal(h.get(m["response"]["outputs"][0]), xs[i] * 2)
            counts[i] += 1
    assert counts == [20] * 4


def test_non_decoupled_model_may_answer_through_its_sender(host_factory):
    src = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                r.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([7], np.int32))]),
                                             flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
    h = host_factory(src)
    h.start()
    h.execute([{}, {}])
    m = h.expect("executed")
    assert m["error"] is None and [int(h.get(r["outputs"][0])[0]) for r in m["responses"]] == [7, 7]


def test_stub_pool_never_overlaps_live_blocks():
    sys.path.insert(0, STUB_DIR)
    import random
    import nereid_stub_shm as shm

    announced = []

    def announce(index, fd):
        announced.append((index, os.fstat(fd).st_size))

    pool = shm.StubPool(8192, 4096, 1 << 20, announce)
    rng = random.Random(7)
    live = []  # (seg, off, n)
    for step in range(20000):
        if live and rng.random() < 0.5:
            k = 0 if rng.random() < 0.7 else rng.randrange(len(live))
            seg, off, n = live.pop(k)
            struct.pack_into("<I", pool.rings[seg].mm, off - 16, 2)
            continue
        n = rng.choice([1, 17, 100, 500, 1500, 3000])
        seg, off, mm = pool.alloc(n)
        assert (off - 16) % 64 == 0 and off + n <= pool.rings[seg].size
        assert struct.unpack_from("<IIQ", mm, off - 16) == (1, 0, n)
        for s2, o2, n2 in live:
            if s2 == seg:
                assert off + n <= o2 - 16 or o2 + n2 <= off - 16, "overlap"
        live.append((seg, off, n))
    for seg, off, n in live:
        struct.pack_into("<I", pool.rings[seg].mm, off - 16, 2)
    total = pool.total
    for step in range(5000):  # with everything given back, nothing grows
        seg, off, mm = pool.alloc(rng.choice([1, 500, 3000]))
        struct.pack_into("<I", mm, off - 16, 2)
    assert pool.total == total
    # Each segment was announced once, in order, with its size.
    assert announced == [(i, ring.size) for i, ring in enumerate(pool.rings)]
