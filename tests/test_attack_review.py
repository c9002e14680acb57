"""The second attack review (issue 39), one test per finding: each request
here aborted the server, starved other clients or broke a documented bound
before its fix.

Every load is bounded in count and time and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

import helpers
from helpers import EXAMPLES_MODELS, HOST, NereidServer

MiB = 1 << 20
EXIT = ["--exit-timeout-secs", "10"]


def _peak_growth(pid: int, before: int) -> int:
    return helpers.proc_status(pid, "VmHWM") - before


# --------------------------------------------------------------------------
# 2. Control endpoints read their JSON without a JSON tree
# --------------------------------------------------------------------------

CONTROL_PATHS = [
    "/v2/repository/index",
    "/v2/systemsharedmemory/region/r/register",
    "/v2/cudasharedmemory/region/r/register",
    "/v2/logging",
    "/v2/trace/setting",
]


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_a_control_body_of_zeros_is_refused_without_growing_the_server(server, path):
    # 1 MiB of `[0,0,...]` became a 37 MiB JSON tree before.
    body = b"[" + b"0," * (MiB // 2 - 1) + b"0]"
    before = helpers.reset_peak_rss(server.pid)
    resp = helpers.http_post(server, path, data=body)
    helpers.assert_http_error(resp, 400)
    grown = _peak_growth(server.pid, before)
    assert grown <= 4 * MiB, f"peak RSS grew by {grown / MiB:.1f} MiB for a 1 MiB control body"


def test_a_control_body_over_its_limit_is_refused_as_it_streams_in(server):
    chunk = b"0," * (MiB // 2)

    def body():
        yield b"["
        for _ in range(16):
            yield chunk
        yield b"0]"

    before = helpers.reset_peak_rss(server.pid)
    resp = helpers.http_post(server, "/v2/repository/index", data=body())
    helpers.assert_http_error(resp, 400, contains=["control request"])
    assert _peak_growth(server.pid, before) <= 4 * MiB
    assert helpers.repository_index(server)  # still answering


def test_a_control_object_of_many_members_is_refused(server):
    members = ",".join(f'"k{i}":0' for i in range(65))
    resp = helpers.http_post(server, "/v2/logging", data="{" + members + "}")
    helpers.assert_http_error(resp, 400, contains=["more than 64 members"])


# --------------------------------------------------------------------------
# 1. gRPC messages are admitted by their decoded size, not their wire size
# --------------------------------------------------------------------------

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _empty_inputs_message(wire_bytes: int) -> bytes:
    """A ModelInferRequest for `identity` of empty `inputs` entries (field 5,
    two bytes each on the wire, a whole struct each once decoded)."""
    name = b"\x0a\x08identity"
    return name + b"\x2a\x00" * ((wire_bytes - len(name)) // 2)


def _raw_call(server: NereidServer, method: str, message: bytes, stream=False):
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 64 * MiB)]
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        if stream:
            call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
            return list(call(iter([message]), timeout=60))
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        return call(message, timeout=60)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_message_of_empty_inputs_is_refused_by_its_decoded_size(server, stream):
    # 8 MiB of empty inputs grew the server by 1.26 GiB; 48 MiB aborted it.
    message = _empty_inputs_message(8 * MiB)
    before = helpers.reset_peak_rss(server.pid)
    with pytest.raises(grpc.RpcError) as refused:
        replies = _raw_call(server, STREAM if stream else INFER, message, stream=stream)
        # A stream answers its errors in-stream unless asked otherwise.
        if stream and replies and service_pb2.ModelStreamInferResponse.FromString(replies[0]).error_message:
            raise AssertionError(service_pb2.ModelStreamInferResponse.FromString(replies[0]).error_message)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert "decoded" in refused.value.details() or "--max-in-flight-bytes" in refused.value.details()
    grown = _peak_growth(server.pid, before)
    assert grown <= 64 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB for an 8 MiB message"
    helpers.assert_simple_works(server)


def test_more_inputs_than_a_json_request_may_have_are_refused_over_grpc(server):
    message = _empty_inputs_message(2 * 4097 + 10)
    with pytest.raises(grpc.RpcError) as refused:
        _raw_call(server, INFER, message)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inputs of a request: 4097 is more than the limit of 4096" in refused.value.details()


# --------------------------------------------------------------------------
# 9. A config override can ask for neither endless instances nor any host
# --------------------------------------------------------------------------


def _load_with(server: NereidServer, config: dict) -> requests.Response:
    return helpers.http_post(
        server, "/v2/repository/models/simple/load", json={"parameters": {"config": json.dumps(config)}}
    )


@pytest.mark.parametrize("count", [2147483647, 3000])
def test_an_instance_count_over_the_limit_does_not_load(explicit_server, count):
    config = helpers.simple_config_json()
    config["instance_group"] = [{"kind": "KIND_CPU", "count": count}]
    threads_before = helpers.proc_status_value(explicit_server.pid, "Threads")
    resp = _load_with(explicit_server, config)
    helpers.assert_http_error(resp, 400, contains=["a model may have at most 256"])
    assert helpers.proc_status_value(explicit_server.pid, "Threads") <= threads_before + 8
    assert explicit_server.proc.poll() is None


def test_an_intra_op_thread_count_over_the_limit_does_not_load(explicit_server):
    config = helpers.simple_config_json()
    config["parameters"] = {"intra_op_thread_count": {"string_value": "100000"}}
    resp = _load_with(explicit_server, config)
    helpers.assert_http_error(resp, 400, contains=["at most 256 threads"])


def test_a_config_override_cannot_point_a_remote_model_anywhere(explicit_server):
    config = helpers.simple_config_json()
    config["backend"] = "remote"
    config["parameters"] = {"endpoint": {"string_value": "127.0.0.1:22"}}
    resp = _load_with(explicit_server, config)
    helpers.assert_http_error(resp, 400, contains=["'endpoint'", "only in the model repository"])


# --------------------------------------------------------------------------
# 4. Sequence ids are bounded, and so is the wait for a sequence slot
# --------------------------------------------------------------------------


def _accumulate(client, sequence_id, start=False, end=False, client_timeout=None) -> int:
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    result = client.infer(
        "accumulate_int32",
        [inp],
        sequence_id=sequence_id,
        sequence_start=start,
        sequence_end=end,
        client_timeout=client_timeout,
    )
    return int(result.as_numpy("OUTPUT")[0][0])


def test_a_long_string_sequence_id_is_refused_and_not_remembered(server):
    # 22 sequences with 8 MiB ids left +353 MiB resident, after release.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = helpers.proc_status(server.pid, "VmRSS")
        for n in range(4):
            with pytest.raises(InferenceServerException) as refused:
                _accumulate(client, f"{n}" + "x" * MiB, start=True, end=True)
            assert "a string id may have at most 256" in refused.value.message()
        assert helpers.proc_status(server.pid, "VmRSS") - before <= 16 * MiB
        assert _accumulate(client, "x" * 256, start=True, end=True) == 1
    finally:
        client.close()


def test_starts_beyond_the_sequence_backlog_are_refused_at_once(tmp_path_factory):
    # accumulate_int32 has one instance of 8 slots whose sequences stay live
    # for 5 s: 8 run, at most 64 wait, the rest are refused at once (10,001
    # used to queue until served, 32 in 20 s).
    srv = helpers.launch(tmp_path_factory, "backlog", [EXAMPLES_MODELS], EXIT)
    try:
        def start(n):
            client = grpcclient.InferenceServerClient(srv.grpc_url)
            try:
                _accumulate(client, 50_000 + n, start=True, client_timeout=3)
                return "OK"
            except InferenceServerException as e:
                return e.message() or str(e.status())
            finally:
                client.close()

        with ThreadPoolExecutor(max_workers=96) as pool:
            outcomes = list(pool.map(start, range(96)))
        refused = [o for o in outcomes if "max_sequence_backlog" in o]
        assert outcomes.count("OK") >= 8, outcomes[:10]
        assert len(refused) >= 96 - 8 - 64, outcomes
    finally:
        srv.stop_and_check()


# --------------------------------------------------------------------------
# 6 and 14. System shared memory: no SIGBUS, no map exhaustion, no oracle
# --------------------------------------------------------------------------


def _shm_object(key: str, size: int) -> int:
    fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return fd


def _register(server: NereidServer, name: str, key: str, byte_size: int) -> requests.Response:
    return helpers.http_post(
        server,
        f"/v2/systemsharedmemory/region/{name}/register",
        json={"key": key, "offset": 0, "byte_size": byte_size},
    )


def test_a_region_whose_object_shrank_is_refused_not_a_sigbus(server):
    key = f"/nereid_shrink_{os.getpid()}"
    fd = _shm_object(key, MiB)
    try:
        assert _register(server, "shrinks", key, MiB).status_code == 200
        os.ftruncate(fd, 16)
        body = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "shrinks", "shared_memory_byte_size": 64,
                                   "shared_memory_offset": 4096},
                }
            ]
        }
        resp = helpers.post_infer(server, "identity", body)
        helpers.assert_http_error(resp, 400, contains=["'shrinks'", "truncated"])
        assert server.proc.poll() is None, "the server died"
        helpers.assert_simple_works(server)
    finally:
        helpers.http_post(server, "/v2/systemsharedmemory/region/shrinks/unregister")
        os.close(fd)
        os.unlink(f"/dev/shm/{key.lstrip('/')}")


def test_registrations_beyond_the_limit_are_refused_and_inference_goes_on(server):
    # 65,375 registrations of one object used every mapping the kernel
    # allows; the next 1 MiB infer aborted the server.
    key = f"/nereid_many_{os.getpid()}"
    fd = _shm_object(key, 4096)
    session = requests.Session()
    try:
        codes = []
        for n in range(1100):
            resp = session.post(
                f"{server.base_url}/v2/systemsharedmemory/region/many{n}/register",
                json={"key": key, "byte_size": 4096},
                timeout=helpers.TIMEOUT,
            )
            codes.append(resp.status_code)
            if resp.status_code != 200:
                assert "maximum of 1024 shared memory regions" in helpers.error_message(resp)
                break
        assert codes.count(200) == 1024, codes[-3:]
        data = np.zeros((1, MiB // 4), dtype=np.float32)
        tensor = {"name": "INPUT0", "shape": list(data.shape), "datatype": "FP32", "data": data.ravel().tolist()}
        assert helpers.post_infer(server, "identity", {"inputs": [tensor]}).status_code == 200
    finally:
        session.post(f"{server.base_url}/v2/systemsharedmemory/unregister", timeout=helpers.TIMEOUT)
        session.close()
        os.close(fd)
        os.unlink(f"/dev/shm/{key.lstrip('/')}")


def test_a_register_refusal_does_not_tell_what_exists_in_dev_shm(server):
    key = f"/nereid_exists_{os.getpid()}"
    fd = _shm_object(key, 4096)
    try:
        missing = helpers.error_message(_register(server, "probe", "/nereid_no_such_object", 8192))
        too_small = helpers.error_message(_register(server, "probe", key, 8192))
        assert missing.replace("/nereid_no_such_object", "K") == too_small.replace(key, "K")
        assert "4096" not in too_small
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{key.lstrip('/')}")


# --------------------------------------------------------------------------
# 5. HTTP/2 connections that do nothing are closed, on every port
# --------------------------------------------------------------------------

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory):
    srv = helpers.launch(
        tmp_path_factory,
        "idle",
        [EXAMPLES_MODELS],
        ["--handshake-timeout-secs", "1", "--http2-idle-timeout-secs", "2", *EXIT],
    )
    yield srv
    srv.stop_and_check()


def _closes_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (whatever
    it sends first, a GOAWAY included, is read and dropped)."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


@pytest.mark.parametrize("port", ["http_port", "grpc_port", "metrics_port"])
def test_a_connection_that_only_sends_the_preface_is_closed(idle_server, port):
    # 4,096 such connections made every request on the HTTP port fail for
    # 50 s or more; 256 on the metrics port made /metrics unreachable.
    socks = [socket.create_connection((HOST, getattr(idle_server, port)), timeout=5) for _ in range(32)]
    try:
        for sock in socks:
            sock.sendall(H2_PREFACE)
        assert all(_closes_within(sock, 10) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    assert requests.get(idle_server.metrics_url, timeout=helpers.TIMEOUT).status_code == 200


def test_an_idle_grpc_connection_is_drained_and_a_streaming_one_is_not(idle_server):
    with grpc.insecure_channel(idle_server.grpc_url) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=service_pb2.ServerReadyRequest.SerializeToString,
            response_deserializer=service_pb2.ServerReadyResponse.FromString,
        )
        assert ready(service_pb2.ServerReadyRequest(), timeout=5).ready
        # A stream held open for three idle timeouts keeps its connection.
        stream = channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        states = []
        channel.subscribe(states.append)
        import queue

        outbox: queue.Queue = queue.Queue()
        replies = stream(iter(outbox.get, None), timeout=30)
        time.sleep(6)
        request = service_pb2.ModelInferRequest(model_name="simple_string")
        outbox.put(request)
        outbox.put(None)
        answers = list(replies)
        assert len(answers) == 1, answers
        # Then, idle, the channel's connection is drained: it goes IDLE.
        time.sleep(6)
        assert states[-1] in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING), states
        # And the next call reconnects as if nothing happened.
        assert ready(service_pb2.ServerReadyRequest(), timeout=5).ready


# --------------------------------------------------------------------------
# 13. The repository-API key can stay out of the process's arguments
# --------------------------------------------------------------------------


def test_a_restriction_key_from_the_environment_is_not_in_the_arguments(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs", numbered=True)
    srv = NereidServer(
        [EXAMPLES_MODELS],
        [
            "--model-control-mode", "explicit", "--load-model", "simple",
            "--http-restricted-api-from-env", "model-repository:admin-key=NEREID_TEST_KEY",
            "--grpc-restricted-protocol-from-env", "model-repository:admin-key=NEREID_TEST_KEY",
            *EXIT,
        ],
        log_path=log_dir / "env-key.log",
        env={"NEREID_TEST_KEY": "hunter2-from-env"},
    ).start()
    try:
        assert b"hunter2" not in Path(f"/proc/{srv.pid}/cmdline").read_bytes()
        refused = helpers.http_post(srv, "/v2/repository/index")
        helpers.assert_http_error(refused, 403, contains=["admin-key"])
        allowed = helpers.http_post(srv, "/v2/repository/index", headers={"admin-key": "hunter2-from-env"})
        assert allowed.status_code == 200, allowed.text
    finally:
        srv.stop_and_check()
    assert "hunter2" not in (log_dir / "env-key.log").read_text()


# --------------------------------------------------------------------------
# 11 and 14. Log settings and shared-memory regions change only from the
# server's host (any client could unregister every region); log lines whole
# --------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a network namespace of its own (root)")
def test_a_client_on_another_host_cannot_change_log_settings_or_shared_memory():
    # The server and both clients run in a network namespace made for this
    # test: a veth pair gives it an address that is not loopback.
    script = f"""
set -e
ip link set lo up
ip link add nereid0 type veth peer name nereid1
ip addr add 10.99.0.1/32 dev nereid0
ip link set nereid1 up
ip link set nereid0 up
{helpers.server_binary()} --model-repository {EXAMPLES_MODELS} --model-control-mode explicit \\
    --http-address 0.0.0.0 --http-port 18000 --grpc-port 0 --allow-metrics false --exit-timeout-secs 5 &
pid=$!
for i in $(seq 200); do curl -sf -o /dev/null http://127.0.0.1:18000/v2/health/live && break; sleep 0.1; done
change() {{ curl -s -o /dev/null -w '%{{http_code}}' -X POST -d '{{"log_verbose_level": 1}}' "$@"; }}
echo "remote=$(change --interface 10.99.0.1 http://10.99.0.1:18000/v2/logging)"
echo "local=$(change http://127.0.0.1:18000/v2/logging)"
echo "read=$(curl -s -o /dev/null -w '%{{http_code}}' --interface 10.99.0.1 http://10.99.0.1:18000/v2/logging)"
unregister() {{ curl -s -o /dev/null -w '%{{http_code}}' -X POST "$@"; }}
echo "shm_remote=$(unregister --interface 10.99.0.1 http://10.99.0.1:18000/v2/systemsharedmemory/unregister)"
echo "shm_local=$(unregister http://127.0.0.1:18000/v2/systemsharedmemory/unregister)"
kill $pid
wait $pid || true
"""
    done = subprocess.run(["unshare", "--net", "bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
    assert seen == {"remote": "403", "local": "200", "read": "200", "shm_remote": "403", "shm_local": "200"}, (
        seen,
        done.stderr[-2000:],
    )


# --------------------------------------------------------------------------
# 3. A JSON answer is reserved at its worst case before it is written
# --------------------------------------------------------------------------


def test_concurrent_json_answers_stay_within_the_budget(tmp_path_factory):
    budget = 64 * MiB
    srv = helpers.launch(
        tmp_path_factory,
        "json-answers",
        [EXAMPLES_MODELS],
        ["--max-in-flight-bytes", str(budget), "--http-max-input-size", str(16 * MiB), *EXIT],
    )
    try:
        # 8 MiB of FP32 in, sent binary; the answer asked for as JSON text,
        # where 0.1 is 20 characters: about 40 MiB each.
        values = np.full(2 * MiB, 0.1, dtype=np.float32)
        header = {
            "inputs": [{"name": "INPUT0", "shape": [1, values.size], "datatype": "FP32",
                        "parameters": {"binary_data_size": values.nbytes}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        }
        body, headers = helpers.binary_body(header, [values.tobytes()])
        idle = helpers.reset_peak_rss(srv.pid)

        def send(_):
            resp = requests.post(f"{srv.base_url}/v2/models/identity/infer", data=body, headers=headers, timeout=120)
            return resp.status_code, (helpers.error_message(resp) if resp.status_code != 200 else "")

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(send, range(4)))
        peak = helpers.proc_status(srv.pid, "VmHWM") - idle
        assert {status for status, _ in results} <= {200, 503}, results
        assert all("--max-in-flight-bytes" in m for s, m in results if s == 503), results
        # The bound of docs/hardening.md: the budget, a quarter MiB per
        # request, 8 MiB. Before, these four grew the server by 311-359 MiB.
        bound = budget + 4 * MiB // 4 + 8 * MiB
        assert peak <= bound, f"peak RSS grew by {peak / MiB:.0f} MiB; the bound is {bound / MiB:.0f} MiB ({results})"
        # One at a time, each fits.
        status, message = send(0)
        assert status == 200, message
    finally:
        srv.stop_and_check()


# --------------------------------------------------------------------------
# 15. docs/hardening.md and the README name every limit the server has
# --------------------------------------------------------------------------

LIMIT_WORDS = ("max", "timeout", "restricted", "allow-remote", "keepalive", "in-flight")


def test_every_limit_flag_is_documented_in_hardening_md_and_the_readme():
    done = subprocess.run([str(helpers.server_binary()), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    flags = {word for word in done.stdout.split() if word.startswith("--") and any(w in word for w in LIMIT_WORDS)}
    flags = {flag.rstrip(",.;:)'") for flag in flags}
    assert "--max-in-flight-bytes" in flags and "--http2-idle-timeout-secs" in flags, flags
    hardening = (helpers.REPO_ROOT / "docs" / "hardening.md").read_text()
    readme = (helpers.REPO_ROOT / "README.md").read_text()
    assert not [f for f in sorted(flags) if f not in hardening], "missing from docs/hardening.md"
    assert not [f for f in sorted(flags) if f not in readme], "missing from README.md"
