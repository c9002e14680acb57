"""Serve the Silero VAD model as a stateful (sequence) model.

Silero VAD (https://github.com/snakers4/silero-vad) scores 32 ms chunks of
16 kHz audio for speech. It is recurrent: each chunk needs the LSTM state
the previous chunk left, and the last 64 samples of that chunk as context.
The PyPI package `silero-vad` ships the ONNX model; its Python wrapper keeps
both by hand. Served by Nereid, the server keeps them instead, as implicit
state of a sequence: one audio stream is one sequence, its chunks are the
sequence's requests, and chunks of many streams run as one batch.

This script wraps the shipped model so that each implicit state has the
batch dimension first (the model's LSTM state is [2, batch, 128]) and the
sample rate is fixed at 16 kHz:

    audio   FP32 [batch, 512]      the chunk
    state   FP32 [batch, 2, 128]   -> state_out     (implicit state)
    context FP32 [batch, 64]       -> context_next  (implicit state)
    probability FP32 [batch, 1]    the speech probability

and writes a model folder with its config.pbtxt:

    .venv/bin/python examples/silero_vad_model.py REPOSITORY [--name silero_vad]

The package is installed without its dependencies (tests/requirements-no-deps.txt):
only its model file is used; nothing imports it, so torch is not needed.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64


def shipped_model() -> Path:
    """The ONNX file inside the installed silero-vad package (not imported)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("silero-vad is not installed: run scripts/setup.sh (tests/requirements-no-deps.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise SystemExit(f"no {path}: the silero-vad package changed its layout")
    return path


def stateful_model():
    """The shipped model with batch-first states and a fixed sample rate."""
    import onnx
    from onnx import TensorProto, compose, helper

    vad = onnx.load(str(shipped_model()))
    opset = next(o.version for o in vad.opset_import if o.domain in ("", "ai.onnx"))
    vad = compose.add_prefix(vad, prefix="vad_")
    batch = "batch"

    def const(name, values, dims):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, values))

    def model(graph):
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=vad.ir_version)

    before = helper.make_graph(
        [
            # The model sees the previous chunk's last 64 samples, then the chunk.
            helper.make_node("Concat", ["context", "audio"], ["x"], axis=1),
            helper.make_node("Transpose", ["state"], ["state_t"], perm=[1, 0, 2]),
            const("sr", [SAMPLE_RATE], []),
            const("tail_start", [-CONTEXT], [1]),
            const("tail_end", [2**62], [1]),
            const("tail_axis", [1], [1]),
            helper.make_node("Slice", ["audio", "tail_start", "tail_end", "tail_axis"], ["tail"]),
        ],
        "before",
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, [batch, CHUNK]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [batch, 2, 128]),
            helper.make_tensor_value_info("context", TensorProto.FLOAT, [batch, CONTEXT]),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, CHUNK + CONTEXT]),
            helper.make_tensor_value_info("state_t", TensorProto.FLOAT, [2, batch, 128]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("tail", TensorProto.FLOAT, [batch, CONTEXT]),
        ],
    )
    after = helper.make_graph(
        [
            helper.make_node("Identity", ["p"], ["probability"]),
            helper.make_node("Transpose", ["s"], ["state_out"], perm=[1, 0, 2]),
            helper.make_node("Identity", ["t"], ["context_next"]),
        ],
        "after",
        [
            helper.make_tensor_value_info("p", TensorProto.FLOAT, [batch, 1]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, batch, 128]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [batch, CONTEXT]),
        ],
        [
            helper.make_tensor_value_info("probability", TensorProto.FLOAT, [batch, 1]),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [batch, 2, 128]),
            helper.make_tensor_value_info("context_next", TensorProto.FLOAT, [batch, CONTEXT]),
        ],
    )
    merged = compose.merge_models(
        model(before),
        vad,
        io_map=[("x", "vad_input"), ("state_t", "vad_state"), ("sr", "vad_sr")],
        outputs=["vad_output", "vad_stateN", "tail"],
    )
    merged = compose.merge_models(
        merged, model(after), io_map=[("vad_output", "p"), ("vad_stateN", "s"), ("tail", "t")]
    )
    onnx.checker.check_model(merged)
    return merged


def config(name: str, max_batch_size: int, instances: int, idle_us: int) -> str:
    return f"""# Silero VAD as a stateful model: one audio stream per sequence (see
# examples/silero_vad_model.py). The server carries the LSTM state and the audio
# context from each chunk to the next; chunks of up to {max_batch_size} streams
# run together, the oldest first.
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "audio" data_type: TYPE_FP32 dims: [ {CHUNK} ] }} ]
output [ {{ name: "probability" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  oldest {{ max_candidate_sequences: 4096 max_queue_delay_microseconds: 0 }}
  state [
    {{ input_name: "state" output_name: "state_out" data_type: TYPE_FP32 dims: [ 2, 128 ]
      initial_state {{ data_type: TYPE_FP32 dims: [ 2, 128 ] zero_data: true name: "zeros" }} }},
    {{ input_name: "context" output_name: "context_next" data_type: TYPE_FP32 dims: [ {CONTEXT} ]
      initial_state {{ data_type: TYPE_FP32 dims: [ {CONTEXT} ] zero_data: true name: "silence" }} }}
  ]
}}
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""


def write(repository: Path, name: str = "silero_vad", max_batch_size: int = 64, instances: int = 1,
          idle_us: int = 5_000_000) -> Path:
    """Writes REPOSITORY/NAME/{config.pbtxt, 1/model.onnx}; returns the folder."""
    import onnx

    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(stateful_model(), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(config(name, max_batch_size, instances, idle_us))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", type=Path)
    parser.add_argument("--name", default="silero_vad")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--instances", type=int, default=1)
    args = parser.parse_args()
    print(write(args.repository, args.name, args.max_batch_size, args.instances))


if __name__ == "__main__":
    main()
