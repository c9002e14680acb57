"""Unload waits, bounded, for the requests a model had admitted, and the
memory its instances held comes back.

- A request executing when the unload arrives is answered, and the unload
  answers after it (the order of the two answers is the assertion, not a
  duration), leaving the model UNAVAILABLE.
- Past `--model-unload-timeout-secs` the unload answers anyway; the model
  is UNLOADING until its last request is answered (successfully), then
  UNAVAILABLE.
- A 128 MiB ONNX model: the server's RSS before the load, after it and
  after the unload; what the load took must come back.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

import helpers

FAULTY = helpers.TESTS_DIR / "python_models" / "faulty"


def _repo(tmp_path_factory, name: str) -> Path:
    repo = tmp_path_factory.mktemp(name) / "models"
    shutil.copytree(FAULTY, repo / "faulty")
    return repo


class Napping:
    """One request that executes for `seconds`, in a thread; records when
    its answer came and whether it succeeded."""

    def __init__(self, server, seconds: float, marker: Path):
        self.marker = marker
        self.answered_at: float | None = None
        self.error: str | None = None
        action = np.array([f"nap:{seconds}:{marker}".encode()], dtype=object)
        self.inputs = [httpclient.InferInput("ACTION", [1], "BYTES")]
        self.inputs[0].set_data_from_numpy(action)
        self.client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the request never started executing"
            time.sleep(0.01)

    def _run(self) -> None:
        try:
            self.client.infer("faulty", self.inputs)
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.error = repr(e)
        self.answered_at = time.monotonic()


def _unload(server) -> float:
    response = helpers.http_post(server, "/v2/repository/models/faulty/unload", data=b"{}")
    assert response.status_code == 200, response.text
    return time.monotonic()


def _state(server, model: str = "faulty") -> tuple[str, str]:
    rows = helpers.http_post(server, "/v2/repository/index", data=b"").json()
    row = next(r for r in rows if r["name"] == model)
    return row["state"], row.get("reason", "")


def test_unload_answers_after_the_requests_it_had_admitted(tmp_path_factory):
    repo = _repo(tmp_path_factory, "unload-waits")
    server = helpers.launch(
        tmp_path_factory, "unload-waits", [repo], ["--model-control-mode", "explicit", "--load-model", "faulty"]
    )
    try:
        request = Napping(server, 1.5, repo.parent / "executing")
        unloaded_at = _unload(server)
        request.thread.join()
        assert request.error is None, request.error
        assert request.answered_at <= unloaded_at, "the unload answered before the request it had admitted"
        assert _state(server) == ("UNAVAILABLE", "unloaded")
        assert "unloaded: its requests finished and its instances are dropped" in server.output()
    finally:
        server.stop_and_check()


def test_unload_waits_no_longer_than_its_timeout(tmp_path_factory):
    repo = _repo(tmp_path_factory, "unload-bounded")
    server = helpers.launch(
        tmp_path_factory,
        "unload-bounded",
        [repo],
        ["--model-control-mode", "explicit", "--load-model", "faulty", "--model-unload-timeout-secs", "1"],
    )
    try:
        request = Napping(server, 6, repo.parent / "executing")
        unloaded_at = _unload(server)
        state, reason = _state(server)
        assert request.answered_at is None, "the request finished before the unload timed out; lengthen its nap"
        assert state == "UNLOADING" and "requests in flight" in reason, (state, reason)
        assert "still in use after the unload timeout" in server.output()
        # Not routable any more, though its instance still runs.
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("faulty")
        request.thread.join()
        assert request.error is None, request.error
        assert request.answered_at > unloaded_at
        helpers.wait_for_index(server, lambda idx: idx["faulty"]["state"] == "UNAVAILABLE")
        assert _state(server) == ("UNAVAILABLE", "unloaded")
    finally:
        server.stop_and_check()


WEIGHT_MIB = 128


def _big_model(folder: Path) -> None:
    """y = x @ W with a 128 MiB float32 W."""
    columns = WEIGHT_MIB * (1 << 20) // 4 // 1024
    weight = numpy_helper.from_array(np.full((1024, columns), 0.5, dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, columns])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    onnx.save_model(model, str(folder / "1" / "model.onnx"))


def test_memory_comes_back_after_an_unload(tmp_path_factory):
    repo = tmp_path_factory.mktemp("unload-rss") / "models"
    _big_model(repo / "big")
    server = helpers.launch(tmp_path_factory, "unload-rss", [repo], ["--model-control-mode", "explicit"])
    try:
        pid = server.proc.pid
        rss = lambda: helpers.proc_status(pid, "VmRSS") / (1 << 20)  # noqa: E731 - MiB
        before = rss()
        response = helpers.http_post(server, "/v2/repository/models/big/load", data=b"{}")
        assert response.status_code == 200, response.text
        # One inference, so that ONNX Runtime's arena holds what a serving model holds.
        x = httpclient.InferInput("x", [1, 1024], "FP32")
        x.set_data_from_numpy(np.ones((1, 1024), dtype=np.float32))
        y = httpclient.InferenceServerClient(server.http_url).infer("big", [x]).as_numpy("y")
        assert float(y[0, 0]) == 512.0
        loaded = rss()
        response = helpers.http_post(server, "/v2/repository/models/big/unload", data=b"{}")
        assert response.status_code == 200, response.text
        assert _state(server, "big") == ("UNAVAILABLE", "unloaded")
        unloaded = rss()
        took, kept = loaded - before, unloaded - before
        print(f"RSS: before load {before:.1f} MiB, loaded +{took:.1f} MiB, after unload +{kept:.1f} MiB")
        assert took >= WEIGHT_MIB * 0.9, (before, loaded)
        # What the weights took has come back; some heap stays with the allocator.
        assert kept < took * 0.25, (before, loaded, unloaded)
    finally:
        server.stop_and_check()
