"""Decoupled models wherever a model may stand, through tritonclient's gRPC
stream: as a sequence model (the sequence batcher in front of a decoupled
backend), as a step of an ensemble (the steps after it run once per
response), and behind a remote model (another server's decoupled model,
called over ModelStreamInfer). Each streams every response, then the final
flag, as Triton's own decoupled models do."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import helpers

REPEAT_SEQUENCE = """name: "repeat_sequence"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] optional: true }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

COPY = """name: "copy_int32"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def stream_ensemble(name: str, repeat: str) -> str:
    """IN -> repeat (decoupled) -> each element copied by copy_int32: one
    response per element, its VALUE and its INDEX."""
    return f"""name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [
  {{ name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "INDEX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
ensemble_scheduling {{
  step [
    {{ model_name: "{repeat}" model_version: -1
      input_map {{ key: "IN" value: "IN" }}
      output_map {{ key: "OUT" value: "element" }}
      output_map {{ key: "IDX" value: "INDEX" }} }},
    {{ model_name: "copy_int32" model_version: -1
      input_map {{ key: "INPUT0" value: "element" }}
      output_map {{ key: "OUTPUT0" value: "VALUE" }} }}
  ]
}}
"""


def remote(name: str, endpoint: str, model: str) -> str:
    """A remote model with its endpoint and the remote's name: its tensors
    and its transaction policy come from the remote's config."""
    return f"""name: "{name}"
backend: "remote"
parameters {{ key: "endpoint" value: {{ string_value: "{endpoint}" }} }}
parameters {{ key: "model_name" value: {{ string_value: "{model}" }} }}
"""


def write_model(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """One server: repeat_int32 (from the examples), a decoupled sequence
    model, and an ensemble with a decoupled step."""
    repo = helpers.private_repo(tmp_path_factory, "decoupled_paths")
    write_model(repo, "repeat_sequence", REPEAT_SEQUENCE)
    write_model(repo, "copy_int32", COPY)
    write_model(repo, "repeat_then_copy", stream_ensemble("repeat_then_copy", "repeat_int32"))
    server = helpers.launch(tmp_path_factory, "decoupled_paths", [repo], [])
    yield server
    server.stop_and_check()


@pytest.fixture(scope="module")
def front(tmp_path_factory, local):
    """A second server whose decoupled model is the first one's repeat_int32,
    called as a remote model, alone and as an ensemble's step."""
    repo = tmp_path_factory.mktemp("decoupled_front") / "models"
    write_model(repo, "remote_repeat", remote("remote_repeat", local.grpc_url, "repeat_int32"))
    write_model(repo, "copy_int32", COPY)
    write_model(repo, "remote_then_copy", stream_ensemble("remote_then_copy", "remote_repeat"))
    server = helpers.launch(tmp_path_factory, "decoupled_front", [repo], [])
    yield server
    server.stop_and_check()


class Stream:
    """tritonclient's gRPC stream, its results in a queue."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, values: list[int], request_id: str, **kw) -> None:
        data = grpcclient.InferInput("IN", [len(values)], "INT32")
        data.set_data_from_numpy(np.array(values, dtype=np.int32))
        self.client.async_stream_infer(model, [data], request_id=request_id, enable_empty_final_response=True, **kw)

    def take(self):
        return self.results.get(timeout=helpers.TIMEOUT)

    def responses(self, count: int, outputs: tuple[str, str]) -> dict[str, list]:
        """The next `count` results that are not final flags, by request id:
        each as its two outputs' first elements."""
        by_id: dict[str, list] = {}
        while count:
            result, error = self.take()
            assert error is None, error.message()
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param and not response.outputs:
                by_id.setdefault(response.id, []).append("final")
                continue
            by_id.setdefault(response.id, []).append(tuple(int(result.as_numpy(name)[0]) for name in outputs))
            count -= 1
        return by_id

    def finals(self, ids: set[str]) -> None:
        """Reads until each of `ids` has had its final flag."""
        left = set(ids)
        while left:
            result, error = self.take()
            assert error is None, error.message()
            response = result.get_response()
            assert response.parameters["triton_final_response"].bool_param, response
            left.discard(response.id)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_a_decoupled_sequence_model_streams_each_requests_responses_in_order(local):
    stream = Stream(local.grpc_url)
    try:
        # Two sequences interleaved: each request of each gets all of its
        # responses, in order, then its final flag.
        stream.send("repeat_sequence", [1, 2, 3], "a1", sequence_id=11, sequence_start=True)
        stream.send("repeat_sequence", [7], "b1", sequence_id=22, sequence_start=True)
        stream.send("repeat_sequence", [4, 5], "a2", sequence_id=11, sequence_end=True)
        stream.send("repeat_sequence", [8, 9], "b2", sequence_id=22, sequence_end=True)
        got = stream.responses(8, ("OUT", "IDX"))
        clean = {k: [r for r in v if r != "final"] for k, v in got.items()}
        assert clean == {
            "a1": [(1, 0), (2, 1), (3, 2)],
            "a2": [(4, 0), (5, 1)],
            "b1": [(7, 0)],
            "b2": [(8, 0), (9, 1)],
        }
        finals = {k for k, v in got.items() if "final" in v}
        stream.finals({"a1", "a2", "b1", "b2"} - finals)

        # The sequence rules hold: after END, only a START may follow.
        stream.send("repeat_sequence", [6], "late", sequence_id=11)
        result, error = stream.take()
        assert result is None
        assert "must specify the START flag" in str(error), error
    finally:
        stream.close()


def test_an_ensemble_runs_the_steps_after_a_decoupled_step_once_per_response(local):
    stream = Stream(local.grpc_url)
    try:
        stream.send("repeat_then_copy", [5, 6, 7], "e")
        got = stream.responses(3, ("VALUE", "INDEX"))
        assert [r for r in got["e"] if r != "final"] == [(5, 0), (6, 1), (7, 2)]
        if "final" not in got["e"]:
            stream.finals({"e"})
    finally:
        stream.close()
    # Such an ensemble is decoupled: its config says so, and a unary call is
    # refused with Triton's words.
    config = helpers.http_get(local, "/v2/models/repeat_then_copy/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}, config
    client = grpcclient.InferenceServerClient(local.grpc_url)
    data = grpcclient.InferInput("IN", [1], "INT32")
    data.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer("repeat_then_copy", [data])
    client.close()


def test_a_remote_decoupled_model_streams_through_another_server(front):
    stream = Stream(front.grpc_url)
    try:
        stream.send("remote_repeat", [3, 1, 4], "r")
        got = stream.responses(3, ("OUT", "IDX"))
        assert [r for r in got["r"] if r != "final"] == [(3, 0), (1, 1), (4, 2)]
        if "final" not in got["r"]:
            stream.finals({"r"})

        # And as an ensemble's step: the remote's responses each run the next step here.
        stream.send("remote_then_copy", [9, 8], "rs")
        got = stream.responses(2, ("VALUE", "INDEX"))
        assert [r for r in got["rs"] if r != "final"] == [(9, 0), (8, 1)]
    finally:
        stream.close()
