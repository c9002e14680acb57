"""Ensembles with a real pipeline: a scikit-learn model trained here (a
scaler and a logistic regression on the iris data that ships with
scikit-learn), converted with skl2onnx into two ONNX models, and a third,
hand-built ONNX model for the post-processing (the top class and its
probability). An ensemble joins the three. Its answers through tritonclient
must equal the unsplit pipeline run directly (the whole scikit-learn
pipeline converted as one ONNX model, run in onnxruntime, then the same
post-processing in numpy), when the steps run in the ensemble's own server
and when they run in a second server process, called as remote models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from tritonclient.utils import InferenceServerException

import helpers

# onnxruntime 1.32 reads these; skl2onnx's own default may be newer.
OPSET = 17
MAX_BATCH = 16

SCALER = f"""name: "scaler"
backend: "onnxruntime"
max_batch_size: {MAX_BATCH}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "variable" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""

CLASSIFIER = f"""name: "classifier"
backend: "onnxruntime"
max_batch_size: {MAX_BATCH}
input [ {{ name: "features" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 3 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""

TOP_CLASS = f"""name: "top_class"
backend: "onnxruntime"
max_batch_size: {MAX_BATCH}
input [ {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [
  {{ name: "CONFIDENCE" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "CLASS" data_type: TYPE_INT64 dims: [ 1 ] }}
]
"""

ENSEMBLE = f"""name: "iris"
platform: "ensemble"
max_batch_size: {MAX_BATCH}
input [ {{ name: "MEASUREMENTS" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ 3 ] }},
  {{ name: "CONFIDENCE" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "CLASS" data_type: TYPE_INT64 dims: [ 1 ] }}
]
ensemble_scheduling {{
  step [
    {{
      model_name: "scaler"
      model_version: -1
      input_map {{ key: "X" value: "MEASUREMENTS" }}
      output_map {{ key: "variable" value: "scaled" }}
    }},
    {{
      model_name: "classifier"
      model_version: -1
      input_map {{ key: "features" value: "scaled" }}
      output_map {{ key: "probabilities" value: "PROBABILITIES" }}
    }},
    {{
      model_name: "top_class"
      model_version: -1
      input_map {{ key: "probabilities" value: "PROBABILITIES" }}
      output_map [
        {{ key: "CONFIDENCE" value: "CONFIDENCE" }},
        {{ key: "CLASS" value: "CLASS" }}
      ]
    }}
  ]
}}
"""


def remote(name: str, endpoint: str) -> str:
    """A remote model with nothing but its endpoint: its tensors come from the remote's config."""
    return f"""name: "{name}"
backend: "remote"
parameters {{ key: "endpoint" value: {{ string_value: "{endpoint}" }} }}
"""


def onnx_model(sklearn_model, input_name: str) -> onnx.ModelProto:
    options = {id(sklearn_model): {"zipmap": False}} if hasattr(sklearn_model, "predict_proba") else None
    return convert_sklearn(
        sklearn_model,
        initial_types=[(input_name, FloatTensorType([None, 4]))],
        options=options,
        target_opset=OPSET,
    )


def top_class_model() -> onnx.ModelProto:
    """probabilities [N, 3] -> the highest one [N, 1] and its class [N, 1]."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["probabilities"], ["CONFIDENCE"], keepdims=1, axes=[1]),
            helper.make_node("ArgMax", ["probabilities"], ["CLASS"], axis=1, keepdims=1),
        ],
        "top_class",
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_tensor_value_info("CONFIDENCE", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("CLASS", TensorProto.INT64, [None, 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_model(repo: Path, name: str, config: str, model: onnx.ModelProto | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if model is not None:
        onnx.save(model, str(repo / name / "1" / "model.onnx"))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The trained pipeline: its parts as ONNX, the unsplit ONNX, and test data."""
    iris = load_iris()
    x = iris.data.astype(np.float32)
    rng = np.random.default_rng(7)
    order = rng.permutation(len(x))
    train, test = order[:120], order[120:]
    scaler = StandardScaler().fit(x[train])
    classifier = LogisticRegression(max_iter=1000).fit(scaler.transform(x[train]), iris.target[train])
    whole = make_pipeline(scaler, classifier)
    return {
        "scaler": onnx_model(scaler, "X"),
        "classifier": onnx_model(classifier, "features"),
        "whole": convert_sklearn(
            whole,
            initial_types=[("X", FloatTensorType([None, 4]))],
            options={id(classifier): {"zipmap": False}},
            target_opset=OPSET,
        ),
        "test": x[test],
    }


def reference(pipeline, x: np.ndarray) -> dict[str, np.ndarray]:
    """The unsplit pipeline, run directly in onnxruntime, and the post-processing in numpy."""
    session = onnxruntime.InferenceSession(pipeline["whole"].SerializeToString(), providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(["probabilities"], {"X": x})
    return {
        "PROBABILITIES": probabilities,
        "CONFIDENCE": probabilities.max(axis=1, keepdims=True),
        "CLASS": probabilities.argmax(axis=1).reshape(-1, 1).astype(np.int64),
    }


def members_repo(tmp_path_factory, pipeline, name: str) -> Path:
    repo = tmp_path_factory.mktemp(name) / "models"
    write_model(repo, "scaler", SCALER, pipeline["scaler"])
    write_model(repo, "classifier", CLASSIFIER, pipeline["classifier"])
    write_model(repo, "top_class", TOP_CLASS, top_class_model())
    return repo


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, pipeline):
    """One server with the members and the ensemble."""
    repo = members_repo(tmp_path_factory, pipeline, "ensemble_local")
    write_model(repo, "iris", ENSEMBLE)
    server = helpers.launch(tmp_path_factory, "ensemble_local", [repo], [])
    yield server
    server.stop_and_check()


@pytest.fixture(scope="module")
def split(tmp_path_factory, pipeline):
    """The members in one server process; the ensemble in another, its steps remote models."""
    members = helpers.launch(tmp_path_factory, "ensemble_members", [members_repo(tmp_path_factory, pipeline, "ensemble_members")], [])
    repo = tmp_path_factory.mktemp("ensemble_front") / "models"
    for name in ("scaler", "classifier", "top_class"):
        write_model(repo, name, remote(name, members.grpc_url))
    write_model(repo, "iris", ENSEMBLE)
    front = helpers.launch(tmp_path_factory, "ensemble_front", [repo], [])
    yield members, front
    front.stop_and_check()
    if members.proc.poll() is None:
        members.stop_and_check()


def infer(module, url: str, x: np.ndarray) -> dict[str, np.ndarray]:
    client = module.InferenceServerClient(url=url)
    tensor = module.InferInput("MEASUREMENTS", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("iris", [tensor])
    return {name: result.as_numpy(name) for name in ("PROBABILITIES", "CONFIDENCE", "CLASS")}


def assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    np.testing.assert_allclose(got["PROBABILITIES"], want["PROBABILITIES"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["CONFIDENCE"], want["CONFIDENCE"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["CLASS"], want["CLASS"])


@pytest.mark.parametrize("module, port", [(httpclient, "http"), (grpcclient, "grpc")])
def test_the_ensemble_answers_like_the_unsplit_pipeline(in_process, pipeline, module, port):
    url = in_process.http_url if port == "http" else in_process.grpc_url
    x = pipeline["test"][:MAX_BATCH]
    assert_matches(infer(module, url, x), reference(pipeline, x))
    # One row at a time too.
    for row in pipeline["test"][:3]:
        one = row.reshape(1, 4)
        assert_matches(infer(module, url, one), reference(pipeline, one))


def test_the_ensemble_describes_itself_and_counts_its_members(in_process, pipeline):
    client = httpclient.InferenceServerClient(url=in_process.http_url)
    metadata = client.get_model_metadata("iris")
    assert metadata["platform"] == "ensemble"
    assert [o["name"] for o in metadata["outputs"]] == ["PROBABILITIES", "CONFIDENCE", "CLASS"]
    before = {m["name"]: m["inference_count"] for m in client.get_inference_statistics()["model_stats"]}
    infer(httpclient, in_process.http_url, pipeline["test"][:4])
    after = {m["name"]: m["inference_count"] for m in client.get_inference_statistics()["model_stats"]}
    for model in ("iris", "scaler", "classifier", "top_class"):
        assert after[model] - before[model] == 4, (model, before, after)


@pytest.mark.parametrize("module, port", [(httpclient, "http"), (grpcclient, "grpc")])
def test_the_ensemble_split_over_two_servers_answers_the_same(split, pipeline, module, port):
    members, front = split
    url = front.http_url if port == "http" else front.grpc_url
    x = pipeline["test"][:MAX_BATCH]
    assert_matches(infer(module, url, x), reference(pipeline, x))
    # The steps ran in the members' server.
    stats = httpclient.InferenceServerClient(url=members.http_url).get_inference_statistics("classifier")
    assert stats["model_stats"][0]["inference_count"] >= len(x)


def test_a_remote_step_that_is_down_is_named(split, pipeline):
    members, front = split
    members.stop_and_check()
    client = httpclient.InferenceServerClient(url=front.http_url)
    tensor = httpclient.InferInput("MEASUREMENTS", [1, 4], "FP32")
    tensor.set_data_from_numpy(pipeline["test"][:1])
    with pytest.raises(InferenceServerException) as failure:
        client.infer("iris", [tensor])
    message = str(failure.value)
    assert "in ensemble 'iris', step 1 (model 'scaler') failed: remote model 'scaler' at http://" in message, message
    # The front server itself keeps answering.
    assert client.is_server_live()
