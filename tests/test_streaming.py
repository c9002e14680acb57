"""Decoupled models through Triton's own clients: `repeat_int32` answers
each request with one response per element over tritonclient's gRPC
stream API and over HTTP generate_stream, and refuses unary calls with
Triton's words."""

import json
import queue

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import helpers

MODEL = "repeat_int32"


def _inputs(values, delay_ms=0):
    data = grpcclient.InferInput("IN", [len(values)], "INT32")
    data.set_data_from_numpy(np.array(values, dtype=np.int32))
    delay = grpcclient.InferInput("DELAY", [1], "UINT32")
    delay.set_data_from_numpy(np.array([delay_ms], dtype=np.uint32))
    return [data, delay]


def _is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def _take(results: queue.Queue):
    result, error = results.get(timeout=helpers.TIMEOUT)
    assert error is None, error
    return result


def test_tritonclient_stream_gets_every_response_then_the_final(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        values = [3, 1, 4, 1, 5, 9]
        client.async_stream_infer(MODEL, _inputs(values), request_id="pi", enable_empty_final_response=True)
        got = []
        for _ in values:
            result = _take(results)
            assert not _is_final(result)
            assert result.get_response().id == "pi"
            got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        assert got == [(v, i) for i, v in enumerate(values)]
        final = _take(results)
        assert _is_final(final)
        assert final.get_response().id == "pi"
        assert len(final.get_response().outputs) == 0

        # Two requests in flight on the stream: each gets all of its own.
        client.async_stream_infer(MODEL, _inputs([10, 20, 30], delay_ms=20), request_id="x")
        client.async_stream_infer(MODEL, _inputs([40, 50], delay_ms=20), request_id="y")
        by_id: dict[str, list[int]] = {"x": [], "y": []}
        for _ in range(5):
            result = _take(results)
            by_id[result.get_response().id].append(int(result.as_numpy("OUT")[0]))
        assert by_id == {"x": [10, 20, 30], "y": [40, 50]}

        # An error answers its request; the stream goes on.
        client.async_stream_infer(MODEL, [_inputs([1])[1]], request_id="no-values")
        result, error = results.get(timeout=helpers.TIMEOUT)
        assert result is None and "IN" in str(error), error
        client.async_stream_infer(MODEL, _inputs([7]), request_id="after")
        assert int(_take(results).as_numpy("OUT")[0]) == 7
    finally:
        client.stop_stream()
        client.close()


def test_stop_stream_cancels_what_is_running(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    # Two requests that would take 1000 s each keep both instances busy...
    for i in range(2):
        client.async_stream_infer(MODEL, _inputs(list(range(100_000)), delay_ms=10), request_id=f"long-{i}")
    for _ in range(2):
        _take(results)
    client.stop_stream(cancel_requests=True)
    client.close()
    # ...until the stream is cancelled: then the instances are free again.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(2):
            client.async_stream_infer(MODEL, _inputs([i]), request_id=f"next-{i}")
        assert sorted(int(_take(results).as_numpy("OUT")[0]) for _ in range(2)) == [0, 1]
    finally:
        client.stop_stream()
        client.close()


def test_generate_stream_sends_one_event_per_response(server):
    resp = requests.post(
        f"{server.base_url}/v2/models/{MODEL}/generate_stream",
        json={"id": "g", "IN": [2, 4, 8], "DELAY": 5},
        stream=True,
        timeout=helpers.TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [
        json.loads(line[len("data: "):])
        for line in resp.iter_lines(decode_unicode=True)
        if line
    ]
    assert events == [
        {"model_name": MODEL, "model_version": "1", "id": "g", "OUT": v, "IDX": i}
        for i, v in enumerate([2, 4, 8])
    ]
    # An error before the first response is a plain JSON error.
    resp = requests.post(f"{server.base_url}/v2/models/{MODEL}/generate_stream", json={"IN": "x"}, timeout=helpers.TIMEOUT)
    helpers.assert_http_error(resp, 400, contains=["'IN'"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unary_infer_is_refused_in_tritons_words(server, protocol):
    if protocol == "grpc":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        expected = "ModelInfer RPC doesn't support models with decoupled transaction policy"
        inputs = _inputs([1])
    else:
        client = httpclient.InferenceServerClient(server.http_url)
        expected = "HTTP end point doesn't support models with decoupled transaction policy"
        inputs = [httpclient.InferInput("IN", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer(MODEL, inputs)
    assert expected in str(err.value)
    client.close()
