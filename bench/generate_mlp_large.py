"""Writes bench/models/mlp_large/1/model.onnx, the compute-bound benchmark model.

FP32 [batch, 1024] -> Gemm 4096 -> Relu -> Gemm 4096 -> Relu -> Gemm 1024:
about 25 M weights (96 MiB), heavy enough that compute, not transport,
decides its throughput. Deterministic (fixed seed); written only when
missing, since it is too large to keep in git.

    .venv/bin/python bench/generate_mlp_large.py [--force]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PATH = Path(__file__).resolve().parent / "models" / "mlp_large" / "1" / "model.onnx"
LAYERS = [1024, 4096, 4096, 1024]
SEED = 20261129


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED)
    initializers, nodes = [], []
    current = "INPUT0"
    for i, (n_in, n_out) in enumerate(zip(LAYERS, LAYERS[1:])):
        scale = 1.0 / np.sqrt(n_in)
        w = (rng.standard_normal((n_in, n_out)) * scale).astype(np.float32)
        b = np.zeros((n_out,), dtype=np.float32)
        initializers += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(LAYERS) - 2
        out = "OUTPUT0" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"b{i}"], [out if last else f"g{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp_large",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", LAYERS[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", LAYERS[-1]])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="nereid-bench")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    if PATH.exists() and not args.force:
        return
    PATH.parent.mkdir(parents=True, exist_ok=True)
    tmp = PATH.with_suffix(".tmp")
    tmp.write_bytes(build().SerializeToString())
    tmp.replace(PATH)
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
