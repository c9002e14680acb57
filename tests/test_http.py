"""KServe v2 / Triton HTTP API against the mode-none server on examples/models."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import (
    assert_http_error,
    check_simple_outputs,
    http_get,
    mlp_reference,
    parse_infer_response,
    post_infer,
    simple_http_inputs,
    simple_inputs,
    simple_json_request,
)

UNKNOWN_MODEL_STATUSES = (400, 404, 503)


# --------------------------------------------------------------------------
# Health and metadata
# --------------------------------------------------------------------------


def test_health_live_and_ready(server, http_client):
    assert http_client.is_server_live() is True
    assert http_client.is_server_ready() is True
    assert http_get(server, "/v2/health/live").status_code == 200
    assert http_get(server, "/v2/health/ready").status_code == 200


def test_server_metadata(server, http_client):
    md = http_client.get_server_metadata()
    assert md["name"] == "nereid"
    assert isinstance(md["version"], str) and md["version"]
    assert isinstance(md["extensions"], list)
    assert all(isinstance(e, str) for e in md["extensions"])
    raw = http_get(server, "/v2")
    assert raw.status_code == 200
    assert raw.json() == md


@pytest.mark.parametrize("model", ["simple", "mlp_small", "identity", "identity_bytes", "identity_fp16"])
def test_model_ready(server, http_client, model):
    assert http_client.is_model_ready(model) is True
    assert http_client.is_model_ready(model, "1") is True
    assert http_get(server, f"/v2/models/{model}/ready").status_code == 200
    assert http_get(server, f"/v2/models/{model}/versions/1/ready").status_code == 200


def test_unknown_model_not_ready(server, http_client):
    assert http_client.is_model_ready("no_such_model") is False
    assert http_client.is_model_ready("simple", "9") is False


def _by_name(tensors):
    return {t["name"]: t for t in tensors}


def test_model_metadata_simple(server, http_client):
    md = http_client.get_model_metadata("simple")
    assert md["name"] == "simple"
    assert "1" in md["versions"]
    assert md["platform"] == "onnxruntime_onnx"
    inputs, outputs = _by_name(md["inputs"]), _by_name(md["outputs"])
    assert sorted(inputs) == ["INPUT0", "INPUT1"]
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"]
    for t in list(inputs.values()) + list(outputs.values()):
        assert t["datatype"] == "INT32"
        assert t["shape"] == [-1, 16]
    # Versioned URL answers the same document.
    assert http_client.get_model_metadata("simple", "1") == md


def test_model_metadata_identity_bytes(http_client):
    md = http_client.get_model_metadata("identity_bytes")
    inputs, outputs = _by_name(md["inputs"]), _by_name(md["outputs"])
    assert inputs["INPUT0"]["datatype"] == "BYTES"
    assert inputs["INPUT0"]["shape"] == [-1, -1]
    assert outputs["OUTPUT0"]["datatype"] == "BYTES"


def test_model_metadata_unknown_model(server):
    resp = http_get(server, "/v2/models/no_such_model")
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES, ["Request for unknown model"])


def test_model_config_simple(server, http_client):
    cfg = http_client.get_model_config("simple")
    assert cfg["name"] == "simple"
    assert cfg["max_batch_size"] == 8
    assert cfg["platform"] == "onnxruntime_onnx"
    inputs, outputs = _by_name(cfg["input"]), _by_name(cfg["output"])
    assert sorted(inputs) == ["INPUT0", "INPUT1"]
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"]
    for t in list(inputs.values()) + list(outputs.values()):
        assert t["data_type"] == "TYPE_INT32"
        assert [int(d) for d in t["dims"]] == [16]
    raw = http_get(server, "/v2/models/simple/config")
    assert raw.status_code == 200
    assert raw.json()["max_batch_size"] == 8


@pytest.mark.parametrize(
    "model, data_type, max_batch",
    [
        ("identity", "TYPE_FP32", 8),
        ("identity_bytes", "TYPE_STRING", 8),
        ("identity_fp16", "TYPE_FP16", 8),
        ("mlp_small", "TYPE_FP32", 64),
    ],
)
def test_model_config_others(http_client, model, data_type, max_batch):
    cfg = http_client.get_model_config(model)
    assert cfg["name"] == model
    assert cfg["max_batch_size"] == max_batch
    assert _by_name(cfg["input"])["INPUT0"]["data_type"] == data_type
    assert _by_name(cfg["output"])["OUTPUT0"]["data_type"] == data_type


# --------------------------------------------------------------------------
# Inference: simple (INT32 add/sub)
# --------------------------------------------------------------------------


def _simple_infer(client, a, b, binary: bool, **kw):
    inputs = simple_http_inputs(a, b, binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    return client.infer("simple", inputs, outputs=outputs, **kw)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_simple(http_client, batch, binary):
    a, b = simple_inputs(batch, seed=batch)
    result = _simple_infer(http_client, a, b, binary)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == (batch, 16) and out1.shape == (batch, 16)
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    resp = result.get_response()
    assert resp["model_name"] == "simple"
    assert resp["model_version"] == "1"


def test_infer_simple_explicit_version_and_id(http_client):
    a, b = simple_inputs(2, seed=7)
    result = _simple_infer(http_client, a, b, True, model_version="1", request_id="req-42")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.get_response()["id"] == "req-42"


def test_infer_simple_all_outputs_by_default(http_client):
    # No outputs listed: tritonclient sets parameters.binary_data_output=true and
    # the server must return every output, in binary.
    a, b = simple_inputs(3, seed=11)
    inputs = simple_http_inputs(a, b)
    result = http_client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_simple_one_output_requested(http_client):
    a, b = simple_inputs(1, seed=12)
    inputs = simple_http_inputs(a, b)
    result = http_client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]


def test_infer_simple_plain_json(server):
    """Pure JSON (no binary extension): response is a single JSON document."""
    a, b = simple_inputs(3, seed=5)
    body = simple_json_request(a, b, outputs=["OUTPUT0", "OUTPUT1"])
    body["id"] = "json-1"
    resp = post_infer(server, "simple", body)
    assert resp.status_code == 200, resp.text
    assert "Inference-Header-Content-Length" not in resp.headers
    doc = resp.json()
    assert doc["model_name"] == "simple"
    assert doc["model_version"] == "1"
    assert doc["id"] == "json-1"
    outs = {o["name"]: o for o in doc["outputs"]}
    assert outs["OUTPUT0"]["datatype"] == "INT32"
    assert outs["OUTPUT0"]["shape"] == [3, 16]
    assert outs["OUTPUT0"]["data"] == (a + b).flatten().tolist()
    assert outs["OUTPUT1"]["data"] == (a - b).flatten().tolist()


def test_infer_simple_versioned_url(server):
    a, b = simple_inputs(1, seed=6)
    resp = post_infer(server, "simple", simple_json_request(a, b), version="1")
    _, outputs = parse_infer_response(resp)
    check_simple_outputs(outputs, a, b)


def test_infer_simple_gzip_request(http_client):
    a, b = simple_inputs(3, seed=8)
    result = _simple_infer(http_client, a, b, True, request_compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# --------------------------------------------------------------------------
# Inference: identity models (FP32, BYTES, FP16)
# --------------------------------------------------------------------------


def _identity(client, model, arr, datatype, binary_in=True, binary_out=True):
    inp = httpclient.InferInput("INPUT0", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    result = client.infer(model, [inp], outputs=[out])
    resp = result.get_response()
    (meta,) = resp["outputs"]
    assert meta["name"] == "OUTPUT0"
    assert meta["datatype"] == datatype
    assert meta["shape"] == list(arr.shape)
    return result.as_numpy("OUTPUT0")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_identity_fp32(http_client, binary):
    x = np.array([[0.0, -1.5, 3.25, 1e-30, -7e20], [1.0, 2.0, 3.0, 4.0, 5.0]], dtype=np.float32)
    y = _identity(http_client, "identity", x, "FP32", binary, binary)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x)


def test_identity_fp32_full_batch(http_client):
    x = np.arange(8 * 300, dtype=np.float32).reshape(8, 300) / 7.0
    np.testing.assert_array_equal(_identity(http_client, "identity", x, "FP32"), x)


BYTES_UTF8 = ["hello", "", "naïve café", "日本語テキスト", "emoji 🚀", "tab\tnewline\n\"quote\""]
BYTES_RAW = [b"\xff\xfe\x00\x80", b"", b"\x00\x00", b"plain", "ünïcödé".encode("utf-8"), bytes(range(256))]


def _as_bytes_list(arr):
    return [e if isinstance(e, bytes) else str(e).encode("utf-8") for e in arr.flatten().tolist()]


def test_identity_bytes_binary_raw(http_client):
    x = np.array(BYTES_RAW, dtype=np.object_).reshape(2, 3)
    y = _identity(http_client, "identity_bytes", x, "BYTES")
    assert y.shape == (2, 3)
    assert _as_bytes_list(y) == BYTES_RAW


def test_identity_bytes_binary_utf8(http_client):
    x = np.array([s.encode("utf-8") for s in BYTES_UTF8], dtype=np.object_).reshape(1, 6)
    y = _identity(http_client, "identity_bytes", x, "BYTES")
    assert _as_bytes_list(y) == [s.encode("utf-8") for s in BYTES_UTF8]


def test_identity_bytes_json(http_client):
    x = np.array([s.encode("utf-8") for s in BYTES_UTF8], dtype=np.object_).reshape(3, 2)
    y = _identity(http_client, "identity_bytes", x, "BYTES", binary_in=False, binary_out=False)
    assert y.shape == (3, 2)
    assert _as_bytes_list(y) == [s.encode("utf-8") for s in BYTES_UTF8]


def test_identity_bytes_plain_json(server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, len(BYTES_UTF8)], "data": BYTES_UTF8}]}
    resp = post_infer(server, "identity_bytes", body)
    assert resp.status_code == 200, resp.text
    (out,) = resp.json()["outputs"]
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [1, len(BYTES_UTF8)]
    assert out["data"] == BYTES_UTF8


FP16_VALUES = [0.0, -0.0, 1.0, -2.5, 65504.0, -65504.0, 6.1035e-05, 5.96e-08, float("inf"), float("-inf"), 0.333, 1000.5]


def test_identity_fp16_binary(http_client):
    x = np.array(FP16_VALUES, dtype=np.float16).reshape(2, 6)
    y = _identity(http_client, "identity_fp16", x, "FP16")
    assert y.dtype == np.float16
    assert y.shape == (2, 6)
    # Bit-exact round trip (distinguishes -0.0, subnormals, infinities).
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


def test_identity_fp16_nan_bits(http_client):
    x = np.array([0x7E00, 0x7C01, 0xFE00], dtype=np.uint16).view(np.float16).reshape(1, 3)
    y = _identity(http_client, "identity_fp16", x, "FP16")
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


# --------------------------------------------------------------------------
# Inference: mlp_small (real ONNX Runtime compute)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_mlp_small(http_client, binary):
    rng = np.random.default_rng(99)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 256], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    result = http_client.infer("mlp_small", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    y = result.as_numpy("OUTPUT0")
    assert y.shape == (2, 256)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_mlp_small_max_batch(http_client):
    rng = np.random.default_rng(100)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [64, 256], "FP32")
    inp.set_data_from_numpy(x)
    y = http_client.infer("mlp_small", [inp]).as_numpy("OUTPUT0")
    assert y.shape == (64, 256)
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# tritonclient surfaces server errors
# --------------------------------------------------------------------------


def test_tritonclient_error_misnamed_input(http_client, server):
    a, b = simple_inputs(1)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUTX", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with pytest.raises(InferenceServerException) as exc:
        http_client.infer("simple", inputs)
    assert "INPUTX" in exc.value.message()
    # and the server keeps working
    result = _simple_infer(http_client, a, b, True)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_tritonclient_error_unknown_model(http_client):
    with pytest.raises(InferenceServerException) as exc:
        http_client.get_model_metadata("no_such_model")
    assert "Request for unknown model" in exc.value.message()
    x = np.zeros((1, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        http_client.infer("no_such_model", [inp])
    assert "Request for unknown model" in exc.value.message()
    np.testing.assert_array_equal(_identity(http_client, "identity", x, "FP32"), x)



# --------------------------------------------------------------------------
# Classification extension and compression
# --------------------------------------------------------------------------




@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_top_k(http_client, binary):
    a, b = simple_inputs(2, seed=5)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3)]
    result = http_client.infer("simple", simple_http_inputs(a, b), outputs=outputs)
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 3)
    total = a + b
    for row in range(2):
        expected = np.argsort(-total[row], kind="stable")[:3]
        got = [c.decode() if isinstance(c, bytes) else c for c in classes[row]]
        assert [int(c.split(":")[1]) for c in got] == list(expected)
        assert [int(c.split(":")[0]) for c in got] == list(total[row][expected])


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(http_client, algorithm):
    a, b = simple_inputs(3, seed=9)
    result = http_client.infer(
        "simple",
        simple_http_inputs(a, b),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_response_is_compressed_when_asked(server):
    a, b = simple_inputs(1, seed=2)
    resp = post_infer(server, "simple", simple_json_request(a, b), {"Accept-Encoding": "gzip"})
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("Content-Encoding") == "gzip"
    header, outputs = parse_infer_response(resp)
    np.testing.assert_array_equal(np.asarray(outputs["OUTPUT0"]).reshape(a.shape), a + b)


def test_statistics_count_inferences_and_executions(http_client):
    def counts():
        stats = http_client.get_inference_statistics("simple")["model_stats"]
        assert [s["version"] for s in stats] == ["1"]
        return stats[0]["inference_count"], stats[0]["execution_count"], stats[0]["inference_stats"]["success"]["count"]

    before = counts()
    a, b = simple_inputs(2, seed=4)
    for _ in range(3):
        http_client.infer("simple", simple_http_inputs(a, b))
    after = counts()
    # simple has no dynamic batching: each request is one execution of batch 2.
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (6, 3, 3)
    everything = http_client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} >= {"simple", "mlp_small", "identity"}
    batch = [s for s in http_client.get_inference_statistics("simple")["model_stats"][0]["batch_stats"] if s["batch_size"] == 2]
    assert batch and batch[0]["compute_infer"]["count"] >= 3


def test_http_priority_is_checked_against_the_queue_policy(http_client):
    x = np.ones((1, 256), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        http_client.infer("mlp_small", [inp], priority=3)
    assert "priority" in exc.value.message()
    assert http_client.infer("mlp_small", [inp]).as_numpy("OUTPUT0").shape == (1, 256)
