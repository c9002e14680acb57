"""The ONNX backend reads a model's inputs and outputs from the file's
protobuf (onnxruntime/src/graph_io.rs) instead of opening a session. What it
reads must be what ONNX Runtime reports: each model here is loaded with
auto-complete, and the server's metadata must equal onnxruntime's
`get_inputs()`/`get_outputs()` for the same file. The models cover the
cases where a protobuf reader could differ: an IR-3 graph that lists its
initializers as inputs, symbolic and unknown dimensions, many datatypes,
and weights stored as external data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

import helpers

ORT_DATATYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def old_ir_model() -> onnx.ModelProto:
    """IR 3: the weight is both an initializer and a graph input."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "old_ir",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 8)])
    model.ir_version = 3
    return model


def many_types_model() -> onnx.ModelProto:
    """Identities over many datatypes, with symbolic and unknown dimensions."""
    types = [
        ("f16", TensorProto.FLOAT16, [None, 2]),
        ("f64", TensorProto.DOUBLE, [None, "width"]),
        ("i8", TensorProto.INT8, [None, 3]),
        ("u16", TensorProto.UINT16, [None, 1]),
        ("u64", TensorProto.UINT64, [None, 5]),
        ("flag", TensorProto.BOOL, [None, 1]),
        ("text", TensorProto.STRING, [None, 2]),
    ]
    nodes = [helper.make_node("Identity", [f"in_{n}"], [f"out_{n}"]) for n, _, _ in types]
    inputs = [helper.make_tensor_value_info(f"in_{n}", t, shape) for n, t, shape in types]
    outputs = [helper.make_tensor_value_info(f"out_{n}", t, shape) for n, t, shape in types]
    model = helper.make_model(helper.make_graph(nodes, "many_types", inputs, outputs),
                              opset_imports=[helper.make_operatorsetid("", 13)])
    model.ir_version = 8
    return model


def external_data_model(folder: Path) -> None:
    """A 1 MiB weight stored beside the model file, not in it."""
    weight = numpy_helper.from_array(np.ones((512, 512), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 512])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])
    model.ir_version = 8
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True,
                    location="weights.bin", size_threshold=0)


def ort_signature(path: Path) -> dict:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def describe(values):
        return [
            {
                "name": v.name,
                "datatype": ORT_DATATYPES[v.type],
                "shape": [d if isinstance(d, int) else -1 for d in v.shape],
            }
            for v in values
        ]

    return {"inputs": describe(session.get_inputs()), "outputs": describe(session.get_outputs())}


def test_auto_completed_signatures_equal_onnx_runtimes(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnx-signature") / "models"
    for name, model in [("old_ir", old_ir_model()), ("many_types", many_types_model())]:
        (repo / name / "1").mkdir(parents=True)
        onnx.save_model(model, str(repo / name / "1" / "model.onnx"))
    (repo / "external" / "1").mkdir(parents=True)
    external_data_model(repo / "external" / "1")

    server = helpers.launch(tmp_path_factory, "onnx-signature", [repo], [])
    try:
        for name in ["old_ir", "many_types", "external"]:
            metadata = helpers.http_get(server, f"/v2/models/{name}")
            assert metadata.status_code == 200, metadata.text
            got = metadata.json()
            got = {
                side: [{k: t[k] for k in ("name", "datatype", "shape")} for t in got[side]]
                for side in ("inputs", "outputs")
            }
            expected = ort_signature(repo / name / "1" / "model.onnx")
            assert got == expected, (name, got, expected)
        # The IR-3 model's weight is an initializer, not an input it asks for.
        x = np.ones((2, 4), dtype=np.float32)
        answer = helpers.post_infer(
            server, "old_ir", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.ravel().tolist()}]}
        )
        assert answer.status_code == 200, answer.text
        expected_y = x @ np.arange(12, dtype=np.float32).reshape(4, 3)
        assert answer.json()["outputs"][0]["data"] == expected_y.ravel().tolist()
    finally:
        server.stop_and_check()


def test_a_file_that_is_not_onnx_fails_its_load_with_the_reason(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnx-garbage") / "models"
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "1" / "model.onnx").write_bytes(b"\xff" * 64)
    server = helpers.launch(tmp_path_factory, "onnx-garbage", [repo], ["--model-control-mode", "none"], wait_for="live")
    try:
        index = helpers.wait_for_index(server, lambda idx: "garbage" in idx and idx["garbage"]["state"] == "UNAVAILABLE")
        reason = index["garbage"]["reason"]
        assert "failed to read ONNX model" in reason and "model.onnx" in reason, reason
    finally:
        server.stop_and_check()
