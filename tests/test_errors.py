"""Malformed and invalid requests, limits, compression and broken models.

Every error case is followed by a valid request on the same server to show it
still serves. HTTP errors must be Triton-style JSON bodies {"error": "..."}.
"""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest
import requests

from helpers import (
    BROKEN_REPO_MODELS,
    SMALL_GRPC_MAX_MESSAGE,
    SMALL_HTTP_MAX_INPUT,
    TIMEOUT,
    assert_http_error,
    assert_simple_works,
    binary_body,
    encode_bytes_elements,
    http_get,
    parse_infer_response,
    post_infer,
    repository_index,
    simple_inputs,
    simple_json_request,
)

UNKNOWN_MODEL_STATUSES = (400, 404, 503)
TOO_LARGE_STATUSES = (400, 413)


def _simple_binary(a: np.ndarray, b: np.ndarray, size0: int | None = None, size1: int | None = None):
    """Binary-extension request for `simple` (header dict, blobs)."""
    header = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": list(a.shape),
             "parameters": {"binary_data_size": a.nbytes if size0 is None else size0}},
            {"name": "INPUT1", "datatype": "INT32", "shape": list(b.shape),
             "parameters": {"binary_data_size": b.nbytes if size1 is None else size1}},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
        ],
    }
    return header, [a.tobytes(), b.tobytes()]


def _tensor(name="INPUT0", datatype="INT32", shape=(1, 16), data=None):
    if data is None:
        n = int(np.prod(shape)) if all(d >= 0 for d in shape) else 16
        data = list(range(n))
    return {"name": name, "datatype": datatype, "shape": list(shape), "data": data}


# --------------------------------------------------------------------------
# Positive controls for the hand-built encodings used below
# --------------------------------------------------------------------------


def test_hand_built_binary_request_works(server):
    a, b = simple_inputs(2, seed=21)
    body, headers = binary_body(*_simple_binary(a, b))
    resp = post_infer(server, "simple", body, headers)
    assert resp.status_code == 200, resp.text
    assert "Inference-Header-Content-Length" in resp.headers
    header, outputs = parse_infer_response(resp)
    for out in header["outputs"]:
        assert out["parameters"]["binary_data_size"] == 2 * 16 * 4
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def test_hand_built_bytes_request_works(server):
    elements = [b"", b"\xff\x00raw", "ü".encode(), b"x" * 300]
    blob = encode_bytes_elements(elements)
    header = {
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2], "parameters": {"binary_data_size": len(blob)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    resp = post_infer(server, "identity_bytes", *binary_body(header, [blob]))
    _, outputs = parse_infer_response(resp)
    assert outputs["OUTPUT0"] == elements


# --------------------------------------------------------------------------
# Malformed request bodies
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b'{"inputs": [', b"", b"not json at all", b"[1, 2, 3]", b'{"inputs": "INPUT0"}', b"\xff\xfe\xfd"],
    ids=["truncated", "empty", "garbage", "array", "inputs-not-list", "invalid-utf8"],
)
def test_malformed_json(server, body):
    resp = post_infer(server, "simple", body, {"Content-Type": "application/json"})
    assert_http_error(resp, 400)
    assert_simple_works(server)


def test_missing_inputs_field(server):
    resp = post_infer(server, "simple", {"outputs": [{"name": "OUTPUT0"}]})
    assert_http_error(resp, 400)
    assert_simple_works(server)


# --------------------------------------------------------------------------
# Unknown model / version
# --------------------------------------------------------------------------


def test_unknown_model(server):
    a, b = simple_inputs(1)
    resp = post_infer(server, "no_such_model", simple_json_request(a, b))
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES, ["Request for unknown model"])
    assert_simple_works(server)


def test_unknown_version(server):
    a, b = simple_inputs(1)
    resp = post_infer(server, "simple", simple_json_request(a, b), version="9")
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES, ["Request for unknown model"])
    resp = http_get(server, "/v2/models/simple/versions/9")
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES, ["Request for unknown model"])
    assert_simple_works(server)


# --------------------------------------------------------------------------
# Invalid inputs / outputs (JSON tensors)
# --------------------------------------------------------------------------

_I0 = _tensor("INPUT0")
_I1 = _tensor("INPUT1")

INVALID_INPUT_CASES = {
    "missing-input": ([_I0], "INPUT1"),
    "extra-input": ([_I0, _I1, _tensor("INPUT2")], "INPUT2"),
    "duplicate-input": ([_I0, _I1, _tensor("INPUT0")], "INPUT0"),
    "misnamed-input": ([_I0, _tensor("INPUTX")], "INPUTX"),
    "wrong-datatype": ([_tensor("INPUT0", "FP32", data=[0.5] * 16), _I1], "INPUT0"),
    "unknown-datatype": ([_tensor("INPUT0", "INT33"), _I1], None),
    "wrong-shape": ([_tensor("INPUT0", shape=(1, 8)), _I1], "INPUT0"),
    "wrong-rank": ([_tensor("INPUT0", shape=(16,)), _I1], None),
    "negative-dim": ([_tensor("INPUT0", shape=(-1, 16), data=list(range(16))), _I1], None),
    "batch-over-max": ([_tensor("INPUT0", shape=(9, 16)), _tensor("INPUT1", shape=(9, 16))], None),
    "short-data": ([_tensor("INPUT0", data=list(range(15))), _I1], "INPUT0"),
    "long-data": ([_tensor("INPUT0", data=list(range(17))), _I1], "INPUT0"),
    "string-data-for-int": ([_tensor("INPUT0", data=["a"] * 16), _I1], None),
    "float-data-for-int": ([_tensor("INPUT0", data=[0.5] * 16), _I1], None),
    "int32-overflow": ([_tensor("INPUT0", data=[2**40] * 16), _I1], None),
}


@pytest.mark.parametrize("case", list(INVALID_INPUT_CASES))
def test_invalid_inputs(server, case):
    inputs, needle = INVALID_INPUT_CASES[case]
    resp = post_infer(server, "simple", {"inputs": inputs})
    assert_http_error(resp, 400, [needle] if needle else [])
    assert_simple_works(server)


@pytest.mark.parametrize(
    "outputs, needle",
    [
        ([{"name": "OUTPUT0"}, {"name": "OUTPUT0"}], "OUTPUT0"),
        ([{"name": "OUTPUTX"}], "OUTPUTX"),
        ([{"name": "OUTPUT0"}, {"name": "INPUT0"}], "INPUT0"),
    ],
    ids=["duplicate-output", "unknown-output", "input-as-output"],
)
def test_invalid_requested_outputs(server, outputs, needle):
    resp = post_infer(server, "simple", {"inputs": [_I0, _I1], "outputs": outputs})
    assert_http_error(resp, 400, [needle])
    assert_simple_works(server)


def test_fp16_as_json_data_rejected(server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]}
    resp = post_infer(server, "identity_fp16", body)
    assert_http_error(resp, 400, ["INPUT0"])
    # The same tensor in binary is fine.
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float16)
    header = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 3], "parameters": {"binary_data_size": x.nbytes}}],
              "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    _, outputs = parse_infer_response(post_infer(server, "identity_fp16", *binary_body(header, [x.tobytes()])))
    np.testing.assert_array_equal(outputs["OUTPUT0"], x)
    assert_simple_works(server)


# --------------------------------------------------------------------------
# Binary tensor extension
# --------------------------------------------------------------------------


def test_binary_data_size_exceeds_body(server):
    a, b = simple_inputs(1)
    header, blobs = _simple_binary(a, b)
    body, headers = binary_body(header, [blobs[0], blobs[1][:32]])  # INPUT1 declares 64, 32 present
    assert_http_error(post_infer(server, "simple", body, headers), 400)
    assert_simple_works(server)


def test_binary_data_size_inconsistent_with_shape(server):
    a, b = simple_inputs(1)
    header, blobs = _simple_binary(a, b, size0=32)  # [1,16] INT32 needs 64 bytes
    body, headers = binary_body(header, [blobs[0][:32], blobs[1]])
    assert_http_error(post_infer(server, "simple", body, headers), 400, ["INPUT0"])
    assert_simple_works(server)


def test_binary_trailing_garbage(server):
    a, b = simple_inputs(1)
    header, blobs = _simple_binary(a, b)
    body, headers = binary_body(header, blobs + [b"\x00" * 16])
    assert_http_error(post_infer(server, "simple", body, headers), 400)
    assert_simple_works(server)


@pytest.mark.parametrize("value", ["-5", "abc", "12abc", "", "BODY+10"])
def test_bad_inference_header_content_length(server, value):
    a, b = simple_inputs(1)
    body, headers = binary_body(*_simple_binary(a, b))
    headers["Inference-Header-Content-Length"] = str(len(body) + 10) if value == "BODY+10" else value
    assert_http_error(post_infer(server, "simple", body, headers), 400)
    assert_simple_works(server)


def test_header_length_cuts_json(server):
    a, b = simple_inputs(1)
    body, headers = binary_body(*_simple_binary(a, b))
    headers["Inference-Header-Content-Length"] = str(int(headers["Inference-Header-Content-Length"]) - 7)
    assert_http_error(post_infer(server, "simple", body, headers), 400)
    assert_simple_works(server)


def _bytes_request(blob: bytes, shape=(1, 2)):
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": list(shape),
                          "parameters": {"binary_data_size": len(blob)}}]}
    return binary_body(header, [blob])


def test_truncated_bytes_element(server):
    # Element 2 claims 100 bytes, 3 present.
    blob = struct.pack("<I", 2) + b"ok" + struct.pack("<I", 100) + b"abc"
    assert_http_error(post_infer(server, "identity_bytes", *_bytes_request(blob)), 400)
    assert_simple_works(server)


def test_truncated_bytes_length_prefix(server):
    blob = struct.pack("<I", 2) + b"ok" + b"\x01\x00"  # half a length prefix
    assert_http_error(post_infer(server, "identity_bytes", *_bytes_request(blob)), 400)
    assert_simple_works(server)


def test_bytes_element_count_mismatch(server):
    blob = encode_bytes_elements([b"a", b"b"])
    assert_http_error(post_infer(server, "identity_bytes", *_bytes_request(blob, shape=(1, 3))), 400, ["INPUT0"])
    assert_simple_works(server)


# --------------------------------------------------------------------------
# Compression
# --------------------------------------------------------------------------


def test_gzip_json_body(server):
    a, b = simple_inputs(3, seed=31)
    raw = json.dumps(simple_json_request(a, b)).encode()
    resp = post_infer(server, "simple", gzip.compress(raw), {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    _, outputs = parse_infer_response(resp)
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def test_gzip_binary_body(server):
    a, b = simple_inputs(2, seed=32)
    body, headers = binary_body(*_simple_binary(a, b))  # header length refers to the inflated body
    headers["Content-Encoding"] = "gzip"
    _, outputs = parse_infer_response(post_infer(server, "simple", gzip.compress(body), headers))
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)


def test_gzip_header_on_plain_body(server):
    a, b = simple_inputs(1)
    raw = json.dumps(simple_json_request(a, b)).encode()
    resp = post_infer(server, "simple", raw, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert_http_error(resp, 400)
    assert_simple_works(server)


def test_truncated_gzip_body(server):
    a, b = simple_inputs(1)
    packed = gzip.compress(json.dumps(simple_json_request(a, b)).encode())
    resp = post_infer(server, "simple", packed[: len(packed) // 2], {"Content-Encoding": "gzip"})
    assert_http_error(resp, 400)
    assert_simple_works(server)


# --------------------------------------------------------------------------
# Size limits (small server: --http-max-input-size 4096, --grpc-max-message-size 65536)
# --------------------------------------------------------------------------


def _identity_fp32_binary(n: int):
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    header = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n], "parameters": {"binary_data_size": x.nbytes}}],
              "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    return x, header


def test_small_server_metadata_name(small_server):
    resp = http_get(small_server, "/v2")
    assert resp.status_code == 200
    assert resp.json()["name"] == "nereid-small"


def test_body_under_limit_works(small_server):
    x, header = _identity_fp32_binary(512)  # 2 KiB of data + header < 4096
    body, headers = binary_body(header, [x.tobytes()])
    assert len(body) < SMALL_HTTP_MAX_INPUT
    _, outputs = parse_infer_response(post_infer(small_server, "identity", body, headers))
    np.testing.assert_array_equal(outputs["OUTPUT0"], x)


def test_body_over_limit(small_server):
    x, header = _identity_fp32_binary(2048)  # 8 KiB
    body, headers = binary_body(header, [x.tobytes()])
    assert len(body) > SMALL_HTTP_MAX_INPUT
    assert_http_error(post_infer(small_server, "identity", body, headers), TOO_LARGE_STATUSES)
    assert_simple_works(small_server)


def test_json_body_over_limit(small_server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2000], "data": [1.25] * 2000}]}
    assert len(json.dumps(body)) > SMALL_HTTP_MAX_INPUT
    assert_http_error(post_infer(small_server, "identity", body), TOO_LARGE_STATUSES)
    assert_simple_works(small_server)


def test_chunked_body_over_limit(small_server):
    x, header = _identity_fp32_binary(2048)
    body, headers = binary_body(header, [x.tobytes()])

    def chunks():  # generator => Transfer-Encoding: chunked, no Content-Length
        for i in range(0, len(body), 1024):
            yield body[i:i + 1024]

    resp = requests.post(small_server.base_url + "/v2/models/identity/infer", data=chunks(), headers=headers, timeout=TIMEOUT)
    assert_http_error(resp, TOO_LARGE_STATUSES)
    assert_simple_works(small_server)


def test_gzip_small_body_works_on_small_server(small_server):
    a, b = simple_inputs(2, seed=41)
    raw = json.dumps(simple_json_request(a, b)).encode()
    assert len(raw) < SMALL_HTTP_MAX_INPUT
    resp = post_infer(small_server, "simple", gzip.compress(raw), {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    _, outputs = parse_infer_response(resp)
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)


def test_gzip_bomb(small_server):
    n = 1 << 19  # 512 Ki floats = 2 MiB inflated
    header = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n], "parameters": {"binary_data_size": 4 * n}}]}
    body, headers = binary_body(header, [bytes(4 * n)])
    packed = gzip.compress(body, compresslevel=9)
    assert len(packed) < SMALL_HTTP_MAX_INPUT, len(packed)  # only inflation crosses the limit
    headers["Content-Encoding"] = "gzip"
    assert_http_error(post_infer(small_server, "identity", packed, headers), TOO_LARGE_STATUSES)
    assert_simple_works(small_server)
    assert http_get(small_server, "/v2/health/live").status_code == 200


def test_grpc_message_over_limit(small_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(small_server.grpc_url) as client:
        x = np.zeros((1, SMALL_GRPC_MAX_MESSAGE // 4 + 1024), dtype=np.float32)  # > 64 KiB
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as exc:
            client.infer("identity", [inp], client_timeout=TIMEOUT)
        # gRPC C-core says RESOURCE_EXHAUSTED for an oversized message; tonic
        # says OUT_OF_RANGE. Both name the limit; clients treat both as final.
        assert exc.value.status() in ("StatusCode.RESOURCE_EXHAUSTED", "StatusCode.OUT_OF_RANGE"), (
            exc.value.status(),
            exc.value.message(),
        )
        assert "65536" in exc.value.message()

        small = np.arange(100, dtype=np.float32).reshape(1, 100)
        inp = grpcclient.InferInput("INPUT0", [1, 100], "FP32")
        inp.set_data_from_numpy(small)
        y = client.infer("identity", [inp], client_timeout=TIMEOUT).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(y, small)


# --------------------------------------------------------------------------
# Broken models in a mode-none repository
# --------------------------------------------------------------------------


def test_broken_repo_index_states(broken_repo_server):
    index = repository_index(broken_repo_server)
    for model, state in BROKEN_REPO_MODELS.items():
        assert model in index, f"{model} missing from index {index}"
        assert index[model]["state"] == state, index[model]


def test_broken_repo_syntax_error_reason(broken_repo_server):
    entry = repository_index(broken_repo_server)["bad_syntax"]
    assert entry["state"] == "UNAVAILABLE"
    assert "config" in entry["reason"].lower(), entry


def test_broken_repo_config_inconsistent_with_onnx(broken_repo_server):
    entry = repository_index(broken_repo_server)["bad_dtype"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"], entry
    assert "INPUT0" in entry["reason"], entry
    resp = http_get(broken_repo_server, "/v2/models/bad_dtype/ready")
    assert resp.status_code != 200
    a, b = simple_inputs(1)
    assert_http_error(post_infer(broken_repo_server, "bad_dtype", simple_json_request(a, b)), UNKNOWN_MODEL_STATUSES)


def test_broken_repo_good_model_serves(broken_repo_server):
    assert http_get(broken_repo_server, "/v2/models/simple/ready").status_code == 200
    assert_simple_works(broken_repo_server)


def test_broken_repo_autocomplete_config(broken_repo_server):
    resp = http_get(broken_repo_server, "/v2/models/auto_simple/config")
    assert resp.status_code == 200, resp.text
    cfg = resp.json()
    assert cfg["name"] == "auto_simple"
    inputs = {t["name"]: t for t in cfg["input"]}
    outputs = {t["name"]: t for t in cfg["output"]}
    assert sorted(inputs) == ["INPUT0", "INPUT1"]
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"]
    for t in list(inputs.values()) + list(outputs.values()):
        assert t["data_type"] == "TYPE_INT32"
        assert int(t["dims"][-1]) == 16
    md = http_get(broken_repo_server, "/v2/models/auto_simple").json()
    assert {t["name"]: t["datatype"] for t in md["inputs"]} == {"INPUT0": "INT32", "INPUT1": "INT32"}
    for t in md["inputs"]:
        assert t["shape"][-1] == 16
    assert_simple_works(broken_repo_server, model="auto_simple", batch=1)
