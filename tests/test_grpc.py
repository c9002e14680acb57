"""KServe v2 / Triton gRPC API against the mode-none server on examples/models."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import TIMEOUT, mlp_reference, simple_inputs

T = TIMEOUT


def _simple_inputs_grpc(a, b, names=("INPUT0", "INPUT1"), dtypes=("INT32", "INT32")):
    inputs = []
    for name, dtype, arr in zip(names, dtypes, (a, b)):
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def _assert_simple_ok(client, batch=2):
    a, b = simple_inputs(batch, seed=4321)
    result = client.infer("simple", _simple_inputs_grpc(a, b), client_timeout=T)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.fixture
def raw_stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


# --------------------------------------------------------------------------
# Health and metadata
# --------------------------------------------------------------------------


def test_health(grpc_client):
    assert grpc_client.is_server_live(client_timeout=T) is True
    assert grpc_client.is_server_ready(client_timeout=T) is True
    for model in ("simple", "mlp_small", "identity", "identity_bytes", "identity_fp16"):
        assert grpc_client.is_model_ready(model, client_timeout=T) is True
        assert grpc_client.is_model_ready(model, "1", client_timeout=T) is True


def test_unknown_model_not_ready(grpc_client):
    assert grpc_client.is_model_ready("no_such_model", client_timeout=T) is False


def test_server_metadata(grpc_client):
    md = grpc_client.get_server_metadata(client_timeout=T)
    assert md.name == "nereid"
    assert md.version
    assert all(isinstance(e, str) for e in md.extensions)


def test_model_metadata_simple(grpc_client):
    md = grpc_client.get_model_metadata("simple", client_timeout=T)
    assert md.name == "simple"
    assert "1" in md.versions
    assert md.platform == "onnxruntime_onnx"
    tensors = {t.name: t for t in list(md.inputs) + list(md.outputs)}
    assert sorted(t.name for t in md.inputs) == ["INPUT0", "INPUT1"]
    assert sorted(t.name for t in md.outputs) == ["OUTPUT0", "OUTPUT1"]
    for t in tensors.values():
        assert t.datatype == "INT32"
        assert list(t.shape) == [-1, 16]


def test_model_metadata_unknown_model(grpc_client):
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.get_model_metadata("no_such_model", client_timeout=T)
    assert "Request for unknown model" in exc.value.message()


def test_model_config_simple(grpc_client):
    cfg = grpc_client.get_model_config("simple", client_timeout=T).config
    assert cfg.name == "simple"
    assert cfg.max_batch_size == 8
    assert cfg.platform == "onnxruntime_onnx"
    assert [i.name for i in cfg.input] == ["INPUT0", "INPUT1"]
    assert [o.name for o in cfg.output] == ["OUTPUT0", "OUTPUT1"]
    for t in list(cfg.input) + list(cfg.output):
        assert t.data_type == model_config_pb2.TYPE_INT32
        assert list(t.dims) == [16]
    as_json = grpc_client.get_model_config("simple", as_json=True, client_timeout=T)
    assert as_json["config"]["max_batch_size"] == 8


def test_model_config_identity_fp16(grpc_client):
    cfg = grpc_client.get_model_config("identity_fp16", client_timeout=T).config
    assert cfg.max_batch_size == 8
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP16
    assert list(cfg.input[0].dims) == [-1]


# --------------------------------------------------------------------------
# Inference
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
def test_infer_simple(grpc_client, batch):
    a, b = simple_inputs(batch, seed=100 + batch)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = grpc_client.infer("simple", _simple_inputs_grpc(a, b), outputs=outputs, request_id="g-1", client_timeout=T)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == (batch, 16) and out0.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    resp = result.get_response()
    assert resp.model_name == "simple"
    assert resp.model_version == "1"
    assert resp.id == "g-1"


def test_infer_simple_all_outputs_by_default(grpc_client):
    a, b = simple_inputs(2, seed=3)
    result = grpc_client.infer("simple", _simple_inputs_grpc(a, b), model_version="1", client_timeout=T)
    assert sorted(o.name for o in result.get_response().outputs) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_simple_typed_contents(raw_stub):
    """Inputs given as InferTensorContents.int_contents instead of raw bytes."""
    a, b = simple_inputs(1, seed=55)
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
        t.contents.int_contents.extend(arr.flatten().tolist())
    resp = raw_stub.ModelInfer(req, timeout=T)
    got = {}
    for i, out in enumerate(resp.outputs):
        if i < len(resp.raw_output_contents):
            got[out.name] = np.frombuffer(resp.raw_output_contents[i], dtype=np.int32).reshape(list(out.shape))
        else:
            got[out.name] = np.array(out.contents.int_contents, dtype=np.int32).reshape(list(out.shape))
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)


def _identity(client, model, arr, datatype):
    inp = grpcclient.InferInput("INPUT0", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr)
    result = client.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")], client_timeout=T)
    (meta,) = result.get_response().outputs
    assert meta.datatype == datatype
    assert list(meta.shape) == list(arr.shape)
    return result.as_numpy("OUTPUT0")


def test_identity_fp32(grpc_client):
    x = np.array([[0.0, -1.5, 3.25, 1e-30, -7e20, 42.0]], dtype=np.float32)
    y = _identity(grpc_client, "identity", x, "FP32")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x)


def test_identity_fp16(grpc_client):
    vals = [0.0, -0.0, 1.0, -2.5, 65504.0, 6.1035e-05, 5.96e-08, float("inf"), float("-inf"), 0.333]
    x = np.array(vals, dtype=np.float16).reshape(2, 5)
    y = _identity(grpc_client, "identity_fp16", x, "FP16")
    assert y.dtype == np.float16 and y.shape == (2, 5)
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


BYTES_VALUES = [
    b"hello", b"", "naïve café".encode(), "日本語".encode(), "🚀".encode(),
    b"\xff\xfe\x00\x80", b"\x00", bytes(range(256)),
]


def test_identity_bytes(grpc_client):
    x = np.array(BYTES_VALUES, dtype=np.object_).reshape(2, 4)
    y = _identity(grpc_client, "identity_bytes", x, "BYTES")
    assert y.shape == (2, 4)
    assert [bytes(e) for e in y.flatten().tolist()] == BYTES_VALUES


def test_mlp_small(grpc_client):
    x = np.random.default_rng(7).standard_normal((2, 256)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", [2, 256], "FP32")
    inp.set_data_from_numpy(x)
    y = grpc_client.infer("mlp_small", [inp], client_timeout=T).as_numpy("OUTPUT0")
    assert y.shape == (2, 256)
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Errors (each followed by a valid request)
# --------------------------------------------------------------------------


def _expect_grpc_error(fn, code: str | None, *needles: str) -> str:
    with pytest.raises(InferenceServerException) as exc:
        fn()
    if code is not None:
        assert exc.value.status() == f"StatusCode.{code}", (exc.value.status(), exc.value.message())
    msg = exc.value.message() or ""
    for n in needles:
        assert n in msg, f"{msg!r} does not mention {n!r}"
    return msg


def test_error_unknown_model(grpc_client):
    a, b = simple_inputs(1)
    # NOT_FOUND or UNAVAILABLE are both accepted; only the message is asserted.
    _expect_grpc_error(
        lambda: grpc_client.infer("no_such_model", _simple_inputs_grpc(a, b), client_timeout=T),
        None, "Request for unknown model",
    )
    _expect_grpc_error(
        lambda: grpc_client.infer("simple", _simple_inputs_grpc(a, b), model_version="9", client_timeout=T),
        None, "Request for unknown model",
    )
    _assert_simple_ok(grpc_client)


def test_error_wrong_datatype(grpc_client):
    a, b = simple_inputs(1)
    inputs = _simple_inputs_grpc(a.astype(np.float32), b, dtypes=("FP32", "INT32"))
    _expect_grpc_error(lambda: grpc_client.infer("simple", inputs, client_timeout=T), "INVALID_ARGUMENT", "INPUT0")
    _assert_simple_ok(grpc_client)


def test_error_misnamed_input(grpc_client):
    a, b = simple_inputs(1)
    inputs = _simple_inputs_grpc(a, b, names=("INPUT0", "INPUTX"))
    _expect_grpc_error(lambda: grpc_client.infer("simple", inputs, client_timeout=T), "INVALID_ARGUMENT", "INPUTX")
    _assert_simple_ok(grpc_client)


def test_error_missing_input(grpc_client):
    a, _ = simple_inputs(1)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    inp.set_data_from_numpy(a)
    _expect_grpc_error(lambda: grpc_client.infer("simple", [inp], client_timeout=T), "INVALID_ARGUMENT", "INPUT1")
    _assert_simple_ok(grpc_client)


def test_error_wrong_shape(grpc_client):
    a = np.zeros((1, 8), dtype=np.int32)
    inputs = _simple_inputs_grpc(a, a)
    _expect_grpc_error(lambda: grpc_client.infer("simple", inputs, client_timeout=T), "INVALID_ARGUMENT", "INPUT0")
    _assert_simple_ok(grpc_client)


def test_error_batch_too_large(grpc_client):
    a, b = simple_inputs(9)
    _expect_grpc_error(
        lambda: grpc_client.infer("simple", _simple_inputs_grpc(a, b), client_timeout=T), "INVALID_ARGUMENT"
    )
    _assert_simple_ok(grpc_client)


def test_error_unknown_requested_output(grpc_client):
    a, b = simple_inputs(1)
    outputs = [grpcclient.InferRequestedOutput("OUTPUTX")]
    _expect_grpc_error(
        lambda: grpc_client.infer("simple", _simple_inputs_grpc(a, b), outputs=outputs, client_timeout=T),
        "INVALID_ARGUMENT", "OUTPUTX",
    )
    _assert_simple_ok(grpc_client)


def _raw_request(a: np.ndarray, b_bytes: bytes, shape_b=(1, 16)):
    req = service_pb2.ModelInferRequest(model_name="simple")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=list(a.shape))
    req.inputs.add(name="INPUT1", datatype="INT32", shape=list(shape_b))
    req.raw_input_contents.append(a.tobytes())
    req.raw_input_contents.append(b_bytes)
    return req


def test_error_raw_content_size_mismatch(raw_stub, grpc_client):
    a, b = simple_inputs(1)
    req = _raw_request(a, b.tobytes()[:60])  # 60 bytes for a [1,16] INT32 tensor
    with pytest.raises(grpc.RpcError) as exc:
        raw_stub.ModelInfer(req, timeout=T)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT1" in exc.value.details()
    _assert_simple_ok(grpc_client)


def test_error_raw_content_count_mismatch(raw_stub, grpc_client):
    a, b = simple_inputs(1)
    req = _raw_request(a, b.tobytes())
    req.raw_input_contents.append(b"\x00" * 64)  # three raw buffers for two inputs
    with pytest.raises(grpc.RpcError) as exc:
        raw_stub.ModelInfer(req, timeout=T)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _assert_simple_ok(grpc_client)


def test_error_mixing_typed_contents_with_raw_contents_in_tritons_words(raw_stub, grpc_client):
    a, b = simple_inputs(1)
    req = service_pb2.ModelInferRequest(model_name="simple")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    typed = req.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    typed.contents.int_contents.extend(b.flatten().tolist())
    req.raw_input_contents.append(a.tobytes())  # one raw buffer, one typed input
    with pytest.raises(grpc.RpcError) as exc:
        raw_stub.ModelInfer(req, timeout=T)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT1' for model 'simple'"
    )
    _assert_simple_ok(grpc_client)


def test_error_truncated_bytes_element(raw_stub, grpc_client):
    req = service_pb2.ModelInferRequest(model_name="identity_bytes")
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2])
    # First element fine, second claims 100 bytes but only 3 follow.
    req.raw_input_contents.append(b"\x02\x00\x00\x00ok" + b"\x64\x00\x00\x00abc")
    with pytest.raises(grpc.RpcError) as exc:
        raw_stub.ModelInfer(req, timeout=T)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _assert_simple_ok(grpc_client)


def test_grpc_classification_top_k(grpc_client):
    import tritonclient.grpc as grpcclient

    a = np.array([[5, 1, 9, 3] * 4], dtype=np.int32)
    b = np.zeros((1, 16), dtype=np.int32)
    inputs = _simple_inputs_grpc(a, b)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1", class_count=2)]
    result = grpc_client.infer("simple", inputs, outputs=outputs)
    classes = [c.decode() for c in result.as_numpy("OUTPUT1").reshape(-1)]
    # Highest value first; ties keep the lower index first.
    assert classes == ["9:2", "9:6"]


def test_grpc_statistics(grpc_client):
    import tritonclient.grpc as grpcclient

    def counts():
        stats = grpc_client.get_inference_statistics("identity", as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    before = counts()
    x = np.ones((3, 5), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [3, 5], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(2):
        grpc_client.infer("identity", [inp])
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (6, 2)


def test_grpc_priority_and_timeout_are_checked_against_the_queue_policy(grpc_client):
    import tritonclient.grpc as grpcclient

    x = np.ones((1, 256), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    # mlp_small batches dynamically, with no priority levels and no timeout override.
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("mlp_small", [inp], priority=2)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "priority" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("mlp_small", [inp], timeout=1000)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "allow_timeout_override" in exc.value.message()
    result = grpc_client.infer("mlp_small", [inp])
    assert result.as_numpy("OUTPUT0").shape == (1, 256)
