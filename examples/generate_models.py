#!/usr/bin/env python3
"""Generate the ONNX example models under examples/models.

Usage (from the repository root):

    .venv/bin/python examples/generate_models.py [--force] [--models-dir DIR]

Only models whose model.onnx is missing are written, unless --force is given.
Output is deterministic: the weights come from a fixed numpy seed and the ONNX
protos are built identically every run, so reruns produce identical bytes.

Every model (written or already present) is checked at the end with
onnx.checker and run once through onnxruntime against a numpy reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9
SEED = 20240611
PRODUCER = "nereid-examples"

MLP_IN = 256
MLP_HIDDEN = 1024
MLP_OUT = 256
WEIGHT_SCALE = 0.05

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = HERE / "models"


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def build_simple() -> onnx.ModelProto:
    """Triton's classic add/sub model on INT32 [batch, 16]."""
    shape = ["batch", 16]
    inputs = [
        helper.make_tensor_value_info("INPUT0", TensorProto.INT32, shape),
        helper.make_tensor_value_info("INPUT1", TensorProto.INT32, shape),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, shape),
        helper.make_tensor_value_info("OUTPUT1", TensorProto.INT32, shape),
    ]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(nodes, "simple", inputs, outputs)
    return _finish(graph)


def build_simple_string() -> onnx.ModelProto:
    """Triton's simple_string: simple's add/sub on decimal strings (BYTES [batch, 16])."""
    shape = ["batch", 16]
    inputs = [
        helper.make_tensor_value_info("INPUT0", TensorProto.STRING, shape),
        helper.make_tensor_value_info("INPUT1", TensorProto.STRING, shape),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, shape),
        helper.make_tensor_value_info("OUTPUT1", TensorProto.STRING, shape),
    ]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32, name="parse0"),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32, name="parse1"),
        helper.make_node("Add", ["a", "b"], ["sum"], name="add"),
        helper.make_node("Sub", ["a", "b"], ["difference"], name="sub"),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING, name="print0"),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING, name="print1"),
    ]
    graph = helper.make_graph(nodes, "simple_string", inputs, outputs)
    return _finish(graph)


def mlp_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    w1 = (rng.standard_normal((MLP_IN, MLP_HIDDEN)) * WEIGHT_SCALE).astype(np.float32)
    b1 = (rng.standard_normal((MLP_HIDDEN,)) * WEIGHT_SCALE).astype(np.float32)
    w2 = (rng.standard_normal((MLP_HIDDEN, MLP_OUT)) * WEIGHT_SCALE).astype(np.float32)
    b2 = (rng.standard_normal((MLP_OUT,)) * WEIGHT_SCALE).astype(np.float32)
    return {"W1": w1, "b1": b1, "W2": w2, "b2": b2}


def build_mlp_small() -> onnx.ModelProto:
    """Two-layer MLP: Gemm(256x1024)+bias -> Relu -> Gemm(1024x256)+bias."""
    weights = mlp_weights()
    initializers = [numpy_helper.from_array(arr, name=name) for name, arr in weights.items()]
    inputs = [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_IN])]
    outputs = [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_OUT])]
    nodes = [
        helper.make_node("Gemm", ["INPUT0", "W1", "b1"], ["hidden"], name="fc1"),
        helper.make_node("Relu", ["hidden"], ["hidden_relu"], name="relu"),
        helper.make_node("Gemm", ["hidden_relu", "W2", "b2"], ["OUTPUT0"], name="fc2"),
    ]
    graph = helper.make_graph(nodes, "mlp_small", inputs, outputs, initializer=initializers)
    return _finish(graph)


MODELS = {
    "simple": build_simple,
    "simple_string": build_simple_string,
    "mlp_small": build_mlp_small,
}


def model_path(models_dir: Path, name: str) -> Path:
    return models_dir / name / "1" / "model.onnx"


def write_models(models_dir: Path, force: bool) -> None:
    for name, build in MODELS.items():
        path = model_path(models_dir, name)
        if path.exists() and not force:
            print(f"[skip]  {path} exists (use --force to rewrite)")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        data = build().SerializeToString()
        tmp = path.with_suffix(".onnx.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        print(f"[write] {path} ({len(data)} bytes)")


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def verify_models(models_dir: Path) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(SEED + 1)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3

    # simple
    path = model_path(models_dir, "simple")
    onnx.checker.check_model(str(path), full_check=True)
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    a = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    print(f"[ok]    {path}: add/sub match numpy")

    # simple_string
    path = model_path(models_dir, "simple_string")
    onnx.checker.check_model(str(path), full_check=True)
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    a = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a.astype(str).astype(object), "INPUT1": b.astype(str).astype(object)})
    np.testing.assert_array_equal(out0.astype(np.int32), a + b)
    np.testing.assert_array_equal(out1.astype(np.int32), a - b)
    print(f"[ok]    {path}: add/sub on strings match numpy")

    # mlp_small
    path = model_path(models_dir, "mlp_small")
    onnx.checker.check_model(str(path), full_check=True)
    w = _initializers(onnx.load(str(path)))
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((4, MLP_IN)).astype(np.float32)
    (out,) = sess.run(["OUTPUT0"], {"INPUT0": x})
    ref = np.maximum(x @ w["W1"] + w["b1"], 0.0) @ w["W2"] + w["b2"]
    assert out.shape == (4, MLP_OUT), out.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    print(f"[ok]    {path}: output matches numpy reference")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rewrite models that already exist")
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=DEFAULT_MODELS_DIR,
        help=f"model repository to write into (default: {DEFAULT_MODELS_DIR})",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    args = parser.parse_args(argv)

    write_models(args.models_dir, args.force)
    if not args.no_verify:
        verify_models(args.models_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
