"""OpenTelemetry traces received over the real OTLP protocol, by a receiver
built on the published OTLP protobuf definitions (opentelemetry-proto), and
Triton's trace setting APIs over HTTP and gRPC."""

from __future__ import annotations

import secrets
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

import helpers
from helpers import HOST

BATCHING = """name: "batching"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value: { string_value: "50" } }
dynamic_batching { max_queue_delay_microseconds: 30000 }
"""

# An ensemble of one step over `batching`.
WRAPPED = """name: "wrapped"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "batching" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" }
} ] }
"""


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - the generated name
        with self.lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait(self, predicate, timeout: float = 15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"the receiver never got the expected spans; it has {len(spans)}")


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(r, grpc_server)
    port = grpc_server.add_insecure_port(f"{HOST}:0")
    grpc_server.start()
    r.port = port
    yield r
    grpc_server.stop(grace=None)


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory, receiver):
    repo = helpers.private_repo(tmp_path_factory, "trace_repo")
    (repo / "batching" / "1").mkdir(parents=True)
    (repo / "batching" / "config.pbtxt").write_text(BATCHING)
    (repo / "wrapped" / "1").mkdir(parents=True)
    (repo / "wrapped" / "config.pbtxt").write_text(WRAPPED)
    srv = helpers.launch(
        tmp_path_factory,
        "traced",
        [repo],
        [
            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
            "--trace-config", f"opentelemetry,url={HOST}:{receiver.port}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100",
            "--exit-timeout-secs", "10",
        ],
    )
    yield srv
    srv.stop_and_check()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def test_the_clients_trace_continues_through_the_server(traced_server, receiver):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    clients = [_traceparent() for _ in range(4)]

    def send(tp):
        return requests.post(
            traced_server.base_url + "/v2/models/batching/infer", json=body,
            headers={"traceparent": tp[0]}, timeout=10,
        ).status_code

    with futures.ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(send, clients)) == [200] * 4
    # And one over gRPC, with the trace context in the metadata.
    grpc_tp = _traceparent()
    client = grpcclient.InferenceServerClient(traced_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    client.infer("batching", [tensor], headers={"traceparent": grpc_tp[0]})
    client.close()
    clients.append(grpc_tp)

    wanted = {bytes.fromhex(t) for _, t, _ in clients}

    def complete(spans):
        requests_seen = {s.trace_id for s in spans if s.name == "InferRequest"}
        executes = [s for s in spans if s.name == "execute"]
        return wanted <= requests_seen and executes

    spans = receiver.wait(complete)
    request_spans = {}
    for _, trace_id, span_id in clients:
        matching = [s for s in spans if s.name == "InferRequest" and s.trace_id == bytes.fromhex(trace_id)]
        assert len(matching) == 1, matching
        span = matching[0]
        assert span.parent_span_id == bytes.fromhex(span_id), "the client's span is the parent"
        request_spans[span.span_id] = span
        children = {s.name for s in spans if s.parent_span_id == span.span_id}
        assert {"queue", "compute_input", "compute_infer", "compute_output"} <= children, children
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["triton.model_name"].string_value == "batching"
    linked = set()
    for execute in (s for s in spans if s.name == "execute"):
        linked |= {link.span_id for link in execute.links}
    assert set(request_spans) <= linked, "every request is linked from the batch that served it"
    assert any(len(s.links) >= 2 for s in spans if s.name == "execute"), "the four HTTP requests shared a batch"


def test_an_ensembles_steps_are_child_requests_of_its_span(traced_server, receiver):
    traceparent, trace_id, client_span = _traceparent()
    body = {"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [3, 4]}]}
    response = requests.post(
        traced_server.base_url + "/v2/models/wrapped/infer", json=body, headers={"traceparent": traceparent}, timeout=10
    )
    assert response.status_code == 200, response.text

    def model(span):
        return {a.key: a.value for a in span.attributes}["triton.model_name"].string_value

    def ours(spans):
        return [s for s in spans if s.trace_id == bytes.fromhex(trace_id) and s.name == "InferRequest"]

    spans = receiver.wait(lambda spans: len(ours(spans)) >= 2)
    by_model = {model(s): s for s in ours(spans)}
    ensemble, step = by_model["wrapped"], by_model["batching"]
    assert ensemble.parent_span_id == bytes.fromhex(client_span), "the client's span is the ensemble's parent"
    assert step.parent_span_id == ensemble.span_id, "the step is a child of the ensemble's request"
    children = {s.name for s in spans if s.parent_span_id == step.span_id}
    assert {"queue", "compute_infer"} <= children, children


def test_a_remote_models_call_carries_its_span_to_the_other_server(tmp_path_factory, traced_server, receiver):
    repo = tmp_path_factory.mktemp("remote_front") / "models"
    (repo / "far" / "1").mkdir(parents=True)
    (repo / "far" / "config.pbtxt").write_text(
        'name: "far"\nbackend: "remote"\n'
        f'parameters {{ key: "endpoint" value: {{ string_value: "{traced_server.grpc_url}" }} }}\n'
        'parameters { key: "model_name" value: { string_value: "batching" } }\n'
    )
    front = helpers.launch(
        tmp_path_factory,
        "remote_front",
        [repo],
        [
            "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
            "--trace-config", f"opentelemetry,url={HOST}:{receiver.port}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100",
        ],
    )
    try:
        traceparent, trace_id, client_span = _traceparent()
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [5, 6]}]}
        response = requests.post(
            front.base_url + "/v2/models/far/infer", json=body, headers={"traceparent": traceparent}, timeout=10
        )
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [5, 6]

        def ours(spans):
            return [s for s in spans if s.trace_id == bytes.fromhex(trace_id) and s.name == "InferRequest"]

        spans = receiver.wait(lambda spans: len(ours(spans)) >= 2)
        names = {{a.key: a.value for a in s.attributes}["triton.model_name"].string_value: s for s in ours(spans)}
        local, remote = names["far"], names["batching"]
        assert local.parent_span_id == bytes.fromhex(client_span)
        assert remote.parent_span_id == local.span_id, "the remote server's span is a child of the calling model's"
    finally:
        front.stop_and_check()


def test_trace_settings_over_http(traced_server):
    settings = helpers.http_get(traced_server, "/v2/trace/setting").json()
    assert settings == {
        "trace_file": "", "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
        "log_frequency": "0", "trace_mode": "opentelemetry",
    }
    model = helpers.http_post(
        traced_server, "/v2/models/simple/trace/setting", json={"trace_level": ["OFF"], "trace_rate": "7"}
    ).json()
    assert model["trace_level"] == ["OFF"] and model["trace_rate"] == "7"
    assert helpers.http_get(traced_server, "/v2/trace/setting").json()["trace_rate"] == "1", "global unchanged"
    cleared = helpers.http_post(traced_server, "/v2/models/simple/trace/setting", json={"trace_level": None}).json()
    assert cleared["trace_level"] == ["TIMESTAMPS"] and cleared["trace_rate"] == "7"
    helpers.http_post(traced_server, "/v2/models/simple/trace/setting", json={"trace_rate": None})


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"trace_level": ["LOUD"]}, "unknown trace level 'LOUD'"),
        ({"trace_rate": "0"}, "'trace_rate' must be a positive integer"),
        ({"trace_count": "-3"}, "'trace_count'"),
        ({"trace_colour": "1"}, "unknown trace setting 'trace_colour'"),
        ({"trace_rate": 5}, "'trace_rate' must be a string"),
    ],
)
def test_bad_trace_settings_are_refused_and_change_nothing(traced_server, change, needle):
    helpers.assert_setting_refused(traced_server, "/v2/trace/setting", change, needle)


def test_trace_settings_over_grpc(traced_server):
    client = grpcclient.InferenceServerClient(traced_server.grpc_url)
    try:
        updated = client.update_trace_settings(model_name="simple", settings={"trace_count": "5"}, as_json=True)
        assert updated["settings"]["trace_count"]["value"] == ["5"]
        assert client.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"] == ["-1"]
        client.update_trace_settings(model_name="simple", settings={"trace_count": None})
        with pytest.raises(Exception) as refused:
            client.update_trace_settings(settings={"trace_level": ["LOUD"]})
        assert "LOUD" in str(refused.value)
        with pytest.raises(Exception) as unknown:
            client.get_trace_settings(model_name="no_such_model")
        assert "no_such_model" in str(unknown.value)
    finally:
        client.close()
