"""The Python backend: Triton model.py models, each instance in its own
Python process, through tritonclient over HTTP and gRPC.

The models are examples/python_models (Triton's example models, written
for this repository) and tests/python_models (the request API, and models
that misbehave on purpose). Every failure must be a clear error for the
request or the model concerned, and nothing else may notice.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

import helpers

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "python_models"
TEST_MODELS = Path(__file__).resolve().parent / "python_models"
BROKEN = ("init_raises", "syntax_error", "no_class")

IDENTITY_INT32 = """name: "identity_int32"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _repository(tmp_path_factory, name: str) -> Path:
    repo = tmp_path_factory.mktemp(name) / "models"
    shutil.copytree(EXAMPLES, repo)
    for model in TEST_MODELS.iterdir():
        shutil.copytree(model, repo / model.name)
    # A built-in model for the BLS calls to reach beside the Python ones.
    (repo / "identity_int32" / "1").mkdir(parents=True)
    (repo / "identity_int32" / "config.pbtxt").write_text(IDENTITY_INT32)
    return repo


def _start(tmp_path_factory, name: str, repo: Path, args: list[str], env: dict | None = None) -> helpers.NereidServer:
    log_dir = tmp_path_factory.mktemp("logs", numbered=True)
    return helpers.NereidServer(
        [repo],
        ["--model-control-mode", "none", "--exit-timeout-secs", "10", *args],
        log_path=log_dir / f"{name}.log",
        env=env,
    ).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = _start(
        tmp_path_factory,
        "python",
        _repository(tmp_path_factory, "python"),
        ["--backend-config=python,execute-timeout-seconds=3", "--backend-config=python,shm-limit-byte-size=33554432"],
    )
    yield srv
    srv.stop_and_check()


def _http(server):
    return httpclient.InferenceServerClient(server.http_url, network_timeout=60)


def _grpc(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def _inputs(module, spec):
    """[(name, array)] -> the client module's InferInputs."""
    made = []
    for name, array in spec:
        datatype = np_to_triton_dtype(array.dtype)
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        made.append(tensor)
    return made


def _add_sub_inputs(module):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    return a, b, _inputs(module, [("INPUT0", a), ("INPUT1", b)])


def _action(module, action: str):
    return _inputs(module, [("ACTION", np.array([action.encode()], dtype=np.object_))])


# ---------------------------------------------------------------------------
# The API
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_answers_over_both_protocols(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else _grpc(server)
    a, b, inputs = _add_sub_inputs(module)
    result = client.infer("add_sub", inputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_reads_its_metadata_and_initialize_its_args(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else _grpc(server)
    data = np.arange(6, dtype=np.float32)
    result = client.infer(
        "inspect",
        _inputs(module, [("INPUT0", data)]),
        request_id="req-7",
        parameters={"temperature": "hot", "count": 3, "flag": True},
        timeout=5_000_000,
    )
    seen = json.loads(result.as_numpy("REQUEST")[0])
    assert seen["id"] == "req-7"
    assert seen["parameters"] == {"temperature": "hot", "count": 3, "flag": True}
    # No outputs named: every output is requested. The timeout is in us.
    assert seen["requested"] == ["ARGS", "ECHO", "REQUEST"]
    assert seen["timeout"] == 5_000_000
    assert seen["inputs"] == ["INPUT0"]
    assert (seen["is_cpu"], seen["cancelled"], seen["shape"]) == (True, False, [6])
    assert (seen["correlation_id"], seen["flags"]) == (0, 0)
    np.testing.assert_array_equal(result.as_numpy("ECHO"), data)
    # The parameters the model set on its response reach the client.
    if protocol == "http":
        answered = result.get_response()["parameters"]
    else:
        wire = result.get_response().parameters
        answered = {
            "answered": wire["answered"].string_param,
            "inputs": wire["inputs"].int64_param,
            "echoed": wire["echoed"].bool_param,
        }
    assert answered == {"answered": "req-7", "inputs": 1, "echoed": True}
    named = [module.InferRequestedOutput(name) for name in ("REQUEST", "ECHO")]
    only = client.infer("inspect", _inputs(module, [("INPUT0", data)]), outputs=named)
    assert json.loads(only.as_numpy("REQUEST")[0])["requested"] == ["ECHO", "REQUEST"]
    assert only.as_numpy("ARGS") is None, "an output not asked for is not sent"
    args = json.loads(result.as_numpy("ARGS")[0])
    assert args["model_name"] == "inspect"
    assert (args["model_version"], args["model_instance_kind"], args["model_instance_device_id"]) == ("1", "CPU", "0")
    assert args["model_instance_name"].startswith("inspect_")
    assert Path(args["model_repository"]).name == "inspect"
    assert json.loads(args["model_config"])["name"] == "inspect"
    assert (args["greeting"], args["input_dims"]) == ("hello", [-1])
    # Logger lines reach the server's log, with the model's name.
    deadline = time.monotonic() + 10
    while "inspect saw request 'req-7'" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "inspect saw request 'req-7'" in server.output()
    assert "inspect initialized as inspect_" in server.output()


def test_dynamic_batching_hands_execute_a_batch(server):
    results = queue.Queue()

    def send(i):
        # A client each: one client sends one request at a time.
        inputs = _inputs(httpclient, [("INPUT0", np.array([[i]], dtype=np.int32))])
        results.put((i, _http(server).infer("batcher", inputs)))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    answers = [results.get_nowait() for _ in range(4)]
    for i, result in answers:
        assert result.as_numpy("OUTPUT0").tolist() == [[2 * i]]
        # The preferred batch of 4 forms only when all four are queued.
        assert result.as_numpy("BATCH").tolist() == [[4]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_model_sees_its_correlation_id_and_flags(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else _grpc(server)
    totals, flags = [], []
    for i, value in enumerate([3, 4, 5]):
        result = client.infer(
            "counter_sequence",
            _inputs(module, [("INPUT0", np.array([value], dtype=np.int32))]),
            sequence_id=42 if protocol == "http" else 43,
            sequence_start=i == 0,
            sequence_end=i == 2,
        )
        totals.append(int(result.as_numpy("TOTAL")[0]))
        flags.append(int(result.as_numpy("FLAGS")[0]))
    assert totals == [3, 7, 12]
    assert flags == [1, 0, 2]


def test_a_decoupled_model_streams_over_grpc_and_generate_stream(server):
    client = _grpc(server)
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        inputs = _inputs(
            grpcclient,
            [
                ("IN", np.array([4, 5, 6], dtype=np.int32)),
                ("DELAY", np.array([1, 1, 1], dtype=np.uint32)),
                ("WAIT", np.array([1], dtype=np.uint32)),
            ],
        )
        client.async_stream_infer("repeat_int32", inputs, request_id="s", enable_empty_final_response=True)
        seen = []
        while True:
            result, error = responses.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            seen.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        assert seen == [(4, 0), (5, 1), (6, 2)]
    finally:
        client.stop_stream()
    resp = requests.post(
        f"{server.base_url}/v2/models/repeat_int32/generate_stream",
        json={"IN": [7, 8], "DELAY": [0, 0], "WAIT": [0]},
        stream=True,
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    events = [json.loads(line[len("data: "):]) for line in resp.iter_lines(decode_unicode=True) if line]
    assert [(e["OUT"], e["IDX"]) for e in events] == [(7, 0), (8, 1)]


def _background_stream(server, count: int, delay_ms: int, events: list | None = None) -> list:
    """One generate_stream request of background_streams: its events (also
    appended to `events` as they come, for a caller watching from another
    thread)."""
    resp = requests.post(
        f"{server.base_url}/v2/models/background_streams/generate_stream",
        json={"COUNT": [count], "DELAY_MS": [delay_ms]},
        stream=True,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    seen = [] if events is None else events
    for line in resp.iter_lines(decode_unicode=True):
        if line:
            seen.append(json.loads(line[len("data: ") :]))
    return seen


def test_one_decoupled_instance_streams_requests_its_execute_handed_to_threads(server):
    # Triton's vLLM backend returns from execute at once and streams from a
    # loop of its own: the instance must take the next requests meanwhile.
    results = {}

    def ask(i):
        results[i] = _background_stream(server, count=10, delay_ms=20)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(8))
    for events in results.values():
        assert [e["INDEX"] for e in events] == list(range(10)), events
    peak = max(e["OPEN"] for events in results.values() for e in events)
    assert peak >= 2, "the one instance never had two requests open at once"


def test_a_client_that_stops_reading_holds_back_only_its_own_stream(server):
    # A client that reads nothing: its socket fills, then its stream's
    # queue, then the server fails its request (the model sees it
    # cancelled). Meanwhile the same instance's other streams go on.
    host, port = server.http_url.rsplit(":", 1)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    body = json.dumps({"COUNT": [10_000_000], "DELAY_MS": [0]})
    stalled.sendall(
        (
            "POST /v2/models/background_streams/generate_stream HTTP/1.1\r\nHost: nereid\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
    )
    try:
        deadline = time.monotonic() + 120
        alone = False
        while not alone and time.monotonic() < deadline:
            # Each of these streams completes whatever the stalled one does.
            events = _background_stream(server, count=3, delay_ms=5)
            assert [e["INDEX"] for e in events] == [0, 1, 2], events
            alone = events[-1]["OPEN"] == 1
            time.sleep(0.2)
        assert alone, "the stalled stream was never ended"
        # When it reads at last, its stream ends with why.
        stalled.settimeout(30)
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):
            chunk = stalled.recv(1 << 20)
            assert chunk, "the stalled stream's connection closed before its end"
            received += chunk
        assert b"responses behind the stream" in received[-2000:], received[-2000:]
    finally:
        stalled.close()


def _background_failure(server, action: str):
    """The error of a background_streams request with `action` set, over a gRPC stream."""
    client = _grpc(server)
    inputs = _inputs(
        grpcclient,
        [
            ("COUNT", np.array([1], dtype=np.uint32)),
            ("DELAY_MS", np.array([0], dtype=np.uint32)),
            (action, np.array([True])),
        ],
    )
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put(error))
    try:
        client.async_stream_infer("background_streams", inputs)
        return responses.get(timeout=60)
    finally:
        client.stop_stream()


def test_a_decoupled_execute_that_hangs_times_out_and_the_stub_is_replaced(server):
    # The server's execute timeout is 3 s.
    error = _background_failure(server, "HANG")
    assert error is not None and "sent nothing for" in str(error) and "restarting" in str(error), error
    assert [e["INDEX"] for e in _background_stream(server, count=2, delay_ms=0)] == [0, 1]


def test_a_stub_that_dies_fails_the_streams_its_threads_left_open(server):
    open_streams = [[] for _ in range(3)]
    threads = [
        threading.Thread(target=_background_stream, args=(server, 2000, 20, events)) for events in open_streams
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not all(open_streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(open_streams), "the streams did not start"
    error = _background_failure(server, "EXIT")
    assert error is not None and "exited with status 3" in str(error), error
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a stream left open by the dead stub never ended"
    for events in open_streams:
        assert "error" in events[-1] and "exited with status 3" in events[-1]["error"], events[-1]
        assert len(events) < 2000
    # A new stub takes the next request.
    assert [e["INDEX"] for e in _background_stream(server, count=2, delay_ms=0)] == [0, 1]


def test_business_logic_scripting_calls_python_builtin_and_missing_models(server):
    client = _http(server)
    a, b, _ = _add_sub_inputs(httpclient)
    for model in ("bls_sync", "bls_async"):
        for target, expected in (("add_sub", (a + b, a - b)), ("identity_int32", (a, b))):
            inputs = _inputs(
                httpclient,
                [("MODEL_NAME", np.array([target.encode()], dtype=np.object_)), ("INPUT0", a), ("INPUT1", b)],
            )
            result = client.infer(model, inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected[0])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected[1])
        # A call to a model that is not there comes back as an error response.
        inputs = _inputs(
            httpclient, [("MODEL_NAME", np.array([b"no_such_model"], dtype=np.object_)), ("INPUT0", a), ("INPUT1", b)]
        )
        with pytest.raises(InferenceServerException, match="no_such_model"):
            client.infer(model, inputs)


SIMPLE_ENSEMBLE = """name: "simple_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ {
  model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
"""


def test_business_logic_scripting_reaches_onnx_ensemble_and_remote_models(tmp_path_factory):
    # The remote model's server: the examples, "simple" among them.
    upstream = _start(tmp_path_factory, "bls-upstream", ROOT / "examples" / "models", [])
    try:
        repo = tmp_path_factory.mktemp("bls-targets") / "models"
        shutil.copytree(TEST_MODELS / "bls_forward", repo / "bls_forward")
        shutil.copytree(ROOT / "examples" / "models" / "simple", repo / "simple")
        (repo / "simple_ensemble" / "1").mkdir(parents=True)
        (repo / "simple_ensemble" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)
        (repo / "simple_remote" / "1").mkdir(parents=True)
        (repo / "simple_remote" / "config.pbtxt").write_text(
            'name: "simple_remote"\nbackend: "remote"\n'
            f'parameters {{ key: "endpoint" value: {{ string_value: "{upstream.grpc_url}" }} }}\n'
            'parameters { key: "model_name" value: { string_value: "simple" } }\n'
        )
        srv = _start(tmp_path_factory, "bls-targets", repo, [])
        try:
            a = np.arange(32, dtype=np.int32).reshape(2, 16)
            b = np.full((2, 16), 7, dtype=np.int32)
            for protocol, module, client in (("http", httpclient, _http(srv)), ("grpc", grpcclient, _grpc(srv))):
                for target in ("simple", "simple_ensemble", "simple_remote"):
                    inputs = _inputs(
                        module, [("MODEL_NAME", np.array([target.encode()], dtype=np.object_)), ("INPUT0", a), ("INPUT1", b)]
                    )
                    result = client.infer("bls_forward", inputs)
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b, err_msg=f"{protocol} {target}")
                    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b, err_msg=f"{protocol} {target}")
                # The ONNX model's own error (a batch over its max_batch_size) comes back as the response's.
                big = np.zeros((9, 16), dtype=np.int32)
                inputs = _inputs(
                    module, [("MODEL_NAME", np.array([b"simple"], dtype=np.object_)), ("INPUT0", big), ("INPUT1", big)]
                )
                with pytest.raises(InferenceServerException, match="batch"):
                    client.infer("bls_forward", inputs)
        finally:
            srv.stop_and_check()
    finally:
        upstream.stop_and_check()


def test_decoupled_business_logic_scripting_streams_both_ways(server):
    # bls_decoupled_sync streams square_int32's answers as running sums.
    client = _grpc(server)
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(
            "bls_decoupled_sync", _inputs(grpcclient, [("IN", np.array([3], dtype=np.int32))]), enable_empty_final_response=True
        )
        sums = []
        while True:
            result, error = responses.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            sums.append(int(result.as_numpy("SUM")[0]))
        assert sums == [3, 6, 9]
    finally:
        client.stop_stream()
    # bls_decoupled_async adds up two concurrent streams: 2*2 + 3*3.
    result = _http(server).infer("bls_decoupled_async", _inputs(httpclient, [("IN", np.array([2, 3], dtype=np.int32))]))
    assert int(result.as_numpy("SUM")[0]) == 13


def test_auto_complete_config_fills_in_the_model(server):
    config = _http(server).get_model_config("auto_complete_batch")
    assert config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0"]
    assert "dynamic_batching" in config
    a = np.ones((2, 4), dtype=np.float32) * 3
    result = _http(server).infer("auto_complete_batch", _inputs(httpclient, [("INPUT0", a), ("INPUT1", a)]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * a)


def test_custom_metrics_are_exported_beside_the_servers(server):
    client = _http(server)
    for values in ([1.0, 2.0], [50.0, 0.5, 0.5]):
        client.infer("custom_metrics", _inputs(httpclient, [("INPUT0", np.array(values, dtype=np.float32))]))
    text = requests.get(server.metrics_url, timeout=10).text
    labels = 'model="custom_metrics",version="1"'
    assert f"custom_requests_total{{{labels}}} 2" in text, text
    assert f"custom_last_input_size{{{labels}}} 3" in text
    assert f'custom_input_sum_bucket{{{labels},le="10"}} 1' in text
    assert f'custom_input_sum_bucket{{{labels},le="100"}} 2' in text
    assert "nv_inference_request_success" in text


# ---------------------------------------------------------------------------
# Bad models, bad answers, dying stubs
# ---------------------------------------------------------------------------


def test_models_that_cannot_start_are_unavailable_with_the_reason(server):
    index = helpers.repository_index(server)
    expected = {
        "init_raises": ["RuntimeError", "the weights file is missing"],
        "syntax_error": ["SyntaxError"],
        "no_class": ["TritonPythonModel"],
    }
    for model, words in expected.items():
        entry = index[model]
        assert entry["state"] == "UNAVAILABLE", entry
        for word in words:
            assert word in entry["reason"], entry
    # The others serve.
    assert index["add_sub"]["state"] == "READY"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_answers_fail_their_request_clearly(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else _grpc(server)

    def mode(m):
        return _inputs(module, [("MODE", np.array([m.encode()], dtype=np.object_))])

    expected = {
        "count": "returned 2 responses for 1 request",
        "shape": "output 'OUTPUT0' of shape [3]",
        "name": "output 'OTHER', which its config does not declare",
        "error": "the input is not a cat",
    }
    for m, words in expected.items():
        with pytest.raises(InferenceServerException) as failed:
            client.infer("wrong_outputs", mode(m))
        assert words in failed.value.message(), (m, failed.value.message())
    with pytest.raises(InferenceServerException) as failed:
        client.infer("faulty", _action(module, "raise"))
    assert "ValueError" in failed.value.message() and "asked to raise" in failed.value.message()
    # The model goes on.
    assert client.infer("wrong_outputs", mode("ok")).as_numpy("OUTPUT0").tolist() == [1.0, 1.0]


def test_a_send_after_the_final_flag_is_refused(server):
    client = _grpc(server)
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("after_final", _inputs(grpcclient, [("IN", np.array([5], dtype=np.int32))]))
        result, error = responses.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == 5
    finally:
        client.stop_stream()
    deadline = time.monotonic() + 10
    while "after_final refused" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "after_final refused" in server.output()
    assert "final" in server.output().split("after_final refused", 1)[1].splitlines()[0]


def _stub_pid(client, module) -> int:
    return int(client.infer("faulty", _action(module, "pid")).as_numpy("PID")[0])


@pytest.mark.parametrize("action", ["exit", "segfault", "kill", "sleep"])
def test_a_dying_or_hanging_stub_fails_its_request_and_is_replaced(server, action):
    client = _http(server)
    before = _stub_pid(client, httpclient)
    others = queue.Queue()
    stop = threading.Event()

    def keep_asking():
        # Another Python model, served all along.
        other = _http(server)
        a, b, inputs = _add_sub_inputs(httpclient)
        while not stop.is_set():
            try:
                np.testing.assert_array_equal(other.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
                others.put(True)
            except Exception as e:  # noqa: BLE001 - recorded and asserted on below
                others.put(e)
            time.sleep(0.01)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        if action == "kill":
            # Killed from outside while it executes (it sleeps a minute).
            failure = queue.Queue()

            def sleeper():
                try:
                    client2 = _http(server)
                    client2.infer("faulty", _action(httpclient, "sleep"))
                    failure.put(None)
                except InferenceServerException as e:
                    failure.put(e)

            t = threading.Thread(target=sleeper)
            t.start()
            time.sleep(0.5)
            os.kill(before, signal.SIGKILL)
            t.join(30)
            error = failure.get_nowait()
            assert error is not None
            words = ["killed by signal 9", "restarting"]
        else:
            with pytest.raises(InferenceServerException) as failed:
                client.infer("faulty", _action(httpclient, action))
            error = failed.value
            words = {
                "exit": ["exited with status 3", "restarting"],
                "segfault": ["signal 11", "SIGSEGV"],
                "sleep": ["sent nothing for", "restarting"],
            }[action]
        for word in words:
            assert word in error.message(), error.message()
        # The next request gets a new stub.
        after = _stub_pid(client, httpclient)
        assert after != before
    finally:
        stop.set()
        asker.join(30)
    answers = [others.get_nowait() for _ in range(others.qsize())]
    assert answers and all(a is True for a in answers), [a for a in answers if a is not True][:3]


def _in_thread(call):
    """Runs `call` on a thread; a queue gets its result or its exception."""
    out = queue.Queue()

    def run():
        try:
            out.put(call())
        except Exception as e:  # noqa: BLE001 - handed to the test
            out.put(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _wait_for_file(path: Path, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never created"
        time.sleep(0.01)


def _peek_with_one_waiting(server, tmp_path: Path) -> int:
    """Runs a request that naps, sends a second while it does, and returns
    what the first saw when it woke: 1 if the second's execute was already
    in the stub's socket. Both must succeed, the second after the first."""
    marker = tmp_path / "executing"
    first, first_out = _in_thread(
        lambda: _http(server).infer("faulty", _action(httpclient, f"peek:1.5:{marker}")).as_numpy("PID")[0]
    )
    _wait_for_file(marker)
    second, second_out = _in_thread(lambda: _http(server).infer("faulty", _action(httpclient, "pid")))
    first.join(60)
    second.join(60)
    peeked, answered = first_out.get_nowait(), second_out.get_nowait()
    assert not isinstance(peeked, Exception), peeked
    assert not isinstance(answered, Exception), answered
    return int(peeked)


def test_the_next_execute_waits_in_the_stubs_socket_while_the_current_runs(server, tmp_path):
    # Sent ahead: the stub goes from one execute to the next without
    # waiting for the server, and still runs them one at a time.
    assert _peek_with_one_waiting(server, tmp_path) == 1


def _instance_threads(server, model: str) -> int:
    """How many of the server's threads serve instance 0 of `model`."""
    names = [(task / "comm").read_text().strip() for task in Path(f"/proc/{server.pid}/task").iterdir()]
    return sum(1 for name in names if name.startswith(f"{model}-1-0"))


def test_a_model_without_a_batcher_sends_two_executes_ahead_and_one_behind_a_batcher(server):
    # One request per execute: two wait in the stub's socket. A dynamic
    # batcher forms a batch whenever a thread is free, so there each more
    # thread would make the batches smaller: one waits.
    assert _instance_threads(server, "faulty") == 3
    assert _instance_threads(server, "batcher") == 2


def test_with_execute_ahead_off_the_next_execute_is_sent_after_the_current(tmp_path_factory, tmp_path):
    srv = _start(
        tmp_path_factory,
        "python-one-at-a-time",
        _repository(tmp_path_factory, "python-one-at-a-time"),
        ["--backend-config=python,execute-ahead=0"],
    )
    try:
        assert _instance_threads(srv, "faulty") == 1
        assert _peek_with_one_waiting(srv, tmp_path) == 0
    finally:
        srv.stop_and_check()


def test_a_stub_killed_with_an_execute_waiting_fails_both_and_is_replaced(server, tmp_path):
    client = _http(server)
    before = _stub_pid(client, httpclient)
    marker = tmp_path / "executing"
    running, running_out = _in_thread(lambda: _http(server).infer("faulty", _action(httpclient, f"nap:60:{marker}")))
    _wait_for_file(marker)
    waiting, waiting_out = _in_thread(lambda: _http(server).infer("faulty", _action(httpclient, "pid")))
    time.sleep(0.5)  # its execute is sent while the nap runs
    os.kill(before, signal.SIGKILL)
    running.join(30)
    waiting.join(30)
    for out in (running_out, waiting_out):
        error = out.get_nowait()
        assert isinstance(error, InferenceServerException), error
        for word in ("killed by signal 9", "restarting"):
            assert word in error.message(), error.message()
    # The next request gets a new stub.
    assert _stub_pid(client, httpclient) != before


def test_a_stub_killed_while_idle_is_replaced_before_the_next_request(server):
    client = _http(server)
    before = _stub_pid(client, httpclient)
    os.kill(before, signal.SIGKILL)
    def dead():
        # Gone, or a zombie the server can reap: every thread has exited
        # (until then the kernel does not report the process as ended).
        try:
            zombie = Path(f"/proc/{before}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            return zombie and len(os.listdir(f"/proc/{before}/task")) <= 1
        except OSError:
            return True

    deadline = time.monotonic() + 10
    while not dead() and time.monotonic() < deadline:
        time.sleep(0.02)
    # Nothing was running on it: the next request simply goes to a new stub.
    assert _stub_pid(client, httpclient) != before


def test_a_tensor_past_the_shared_memory_limit_fails_clearly(server):
    client = _http(server)
    with pytest.raises(InferenceServerException) as failed:
        client.infer("faulty", _action(httpclient, "big"))
    # 64 MiB of output against a 32 MiB pool.
    assert "shm-limit-byte-size" in failed.value.message(), failed.value.message()
    _stub_pid(client, httpclient)
    big = np.zeros(40 << 20, dtype=np.uint8).view(np.float32)
    with pytest.raises(InferenceServerException) as failed:
        client.infer("identity_fp32", _inputs(httpclient, [("INPUT0", big.reshape(1, -1))]))
    assert "shm-limit-byte-size" in failed.value.message(), failed.value.message()
    small = np.arange(16, dtype=np.float32).reshape(1, -1)
    np.testing.assert_array_equal(client.infer("identity_fp32", _inputs(httpclient, [("INPUT0", small)])).as_numpy("OUTPUT0"), small)


def test_shared_memory_is_anonymous_and_a_stopped_server_finalizes_its_models(tmp_path_factory):
    repo = tmp_path_factory.mktemp("stopping") / "models"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    srv = _start(tmp_path_factory, "stopping", repo, [])
    a, b, inputs = _add_sub_inputs(httpclient)
    np.testing.assert_array_equal(_http(srv).infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
    # Both pools are memory files passed over the socket, mapped by the
    # server and the stub: nothing in /dev/shm to be left behind, or to
    # outgrow a container's 64 MiB /dev/shm.
    tasks = Path(f"/proc/{srv.pid}/task")
    (stub,) = [int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()]
    for pid in (srv.pid, stub):
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "/memfd:nereid-add_sub-" in maps and "/memfd:nereid-stub-s0" in maps, maps
        assert "/dev/shm/" not in maps
    srv.stop_and_check()
    # SIGTERM unloads every model: finalize runs (what it logs is logged)
    # and the stub has exited before the server does.
    assert "add_sub: finalized" in srv.output()
    try:
        state = Path(f"/proc/{stub}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    assert state in ("gone", "Z"), state


def test_without_python_the_server_starts_and_python_models_say_why(tmp_path_factory):
    repo = tmp_path_factory.mktemp("nopython") / "models"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    (repo / "identity_int32" / "1").mkdir(parents=True)
    (repo / "identity_int32" / "config.pbtxt").write_text(IDENTITY_INT32)
    srv = _start(tmp_path_factory, "nopython", repo, [], env={"PATH": "/nonexistent"})
    try:
        entry = helpers.repository_index(srv)["add_sub"]
        assert entry["state"] == "UNAVAILABLE"
        assert "python3" in entry["reason"] and "was not found" in entry["reason"], entry
        assert helpers.repository_index(srv)["identity_int32"]["state"] == "READY"
    finally:
        srv.stop_and_check()


def test_execution_env_path_names_the_interpreter_as_a_folder_or_a_packed_one(tmp_path_factory):
    """EXECUTION_ENV_PATH: an environment folder (here with Triton's
    $$TRITON_MODEL_DIRECTORY), or a .tar.gz of one, unpacked once."""
    import sys
    import tarfile

    repo = tmp_path_factory.mktemp("envs") / "models"
    venv = Path(sys.executable).parent.parent
    for model, packed in (("env_folder", False), ("env_packed", True)):
        shutil.copytree(EXAMPLES / "add_sub", repo / model)
        # A small environment: this test's interpreter and its packages.
        env = repo / model / "env"
        (env / "bin").mkdir(parents=True)
        (env / "bin" / "python3").symlink_to(Path(sys.executable))
        (env / "lib").symlink_to(venv / "lib")
        shutil.copy(venv / "pyvenv.cfg", env / "pyvenv.cfg")
        where = "$$TRITON_MODEL_DIRECTORY/env"
        if packed:
            with tarfile.open(repo / model / "env.tar.gz", "w:gz") as tar:
                for item in env.iterdir():
                    tar.add(item, arcname=item.name)
            shutil.rmtree(env)
            where = str(repo / model / "env.tar.gz")
        config = (repo / model / "config.pbtxt").read_text().replace('name: "add_sub"', f'name: "{model}"')
        config += f'parameters [ {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{where}" }} }} ]\n'
        (repo / model / "config.pbtxt").write_text(config)
    # The system's python3 first on the PATH (without numpy, where it is
    # there at all): only the named environments can run the models. tar
    # unpacks the packed one.
    srv = _start(tmp_path_factory, "envs", repo, [], env={"PATH": "/usr/bin:/bin"})
    try:
        client = _http(srv)
        a, b, inputs = _add_sub_inputs(httpclient)
        for model in ("env_folder", "env_packed"):
            np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), a + b)
    finally:
        srv.stop_and_check()
