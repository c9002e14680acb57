"""`model_warmup`: every instance runs the config's samples before its
model is READY, with the data they name, and a warmup that fails is a
failed load that leaves the serving version serving.

The model (tests/python_models/warmup_counter) answers each request with
how many requests and executions its instance ran before it, and the sum
of the IN values it saw: the first answers prove warmup ran on the
instance, with which batch sizes, counts and data, before a client's
request could reach it.
"""

from __future__ import annotations

import json
import shutil
import struct
import threading

import numpy as np
import tritonclient.http as httpclient

import helpers

SOURCE = helpers.TESTS_DIR / "python_models" / "warmup_counter"
# The config's samples: zeros as 3 requests twice, then the file's [1.5, 2.5, 3.0] once.
WARMUP_REQUESTS = 3 * 2 + 1
WARMUP_EXECUTIONS = 2 + 1
WARMUP_SUM = 7.0


def _inputs():
    values = httpclient.InferInput("IN", [1, 3], "FP32")
    values.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"client"]], dtype=object))
    return [values, text]


def _config_json(server) -> dict:
    return httpclient.InferenceServerClient(server.http_url).get_model_config("warmup_counter")


def test_every_instance_warms_up_before_the_model_is_ready(tmp_path_factory):
    repo = tmp_path_factory.mktemp("warmup") / "models"
    shutil.copytree(SOURCE, repo / "warmup_counter")
    server = helpers.launch(tmp_path_factory, "warmup", [repo], ["--model-control-mode", "none"])
    try:
        # Enough requests at once that both instances answer some.
        answers = []
        lock = threading.Lock()

        def infer():
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
            result = client.infer("warmup_counter", _inputs())
            with lock:
                answers.append((tuple(result.as_numpy("BEFORE")[0]), float(result.as_numpy("SEEN_SUM")[0][0])))

        threads = [threading.Thread(target=infer) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(answers) == 16, answers
        # Each instance's first client request came after its whole warmup.
        assert min(answers) == ((WARMUP_REQUESTS, WARMUP_EXECUTIONS), WARMUP_SUM), sorted(answers)
        assert all(before[0] >= WARMUP_REQUESTS and seen == WARMUP_SUM for before, seen in answers), answers
        log = server.output()
        warmed = [line for line in log.splitlines() if "instance warmed up" in line]
        assert len(warmed) == 2, warmed
        assert any("instance=0" in line for line in warmed) and any("instance=1" in line for line in warmed), warmed
        # /config shows the samples as written.
        samples = _config_json(server)["model_warmup"]
        assert [s["name"] for s in samples] == ["zeros, batch of 3, twice", "from a file"], samples
    finally:
        server.stop_and_check()


def _load(server, config: dict):
    body = json.dumps({"parameters": {"config": json.dumps(config)}})
    return helpers.http_post(server, "/v2/repository/models/warmup_counter/load", data=body)


def test_a_failed_warmup_fails_the_load_and_the_serving_version_keeps_serving(tmp_path_factory):
    repo = tmp_path_factory.mktemp("warmup-bad") / "models"
    shutil.copytree(SOURCE, repo / "warmup_counter")
    (repo / "warmup_counter" / "warmup" / "fail.bin").write_bytes(struct.pack("<I", 4) + b"fail")
    server = helpers.launch(
        tmp_path_factory,
        "warmup-bad",
        [repo],
        ["--model-control-mode", "explicit", "--load-model", "warmup_counter"],
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        config = _config_json(server)

        def with_text(text: dict) -> dict:
            sample = {
                "name": "bad",
                "batch_size": 1,
                "inputs": {"IN": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}, "TEXT": text},
            }
            return {**config, "model_warmup": [sample]}

        cases = [
            # The model raises on this data: the execution's error is the reason.
            (with_text({"data_type": "TYPE_STRING", "dims": [1], "input_data_file": "fail.bin"}),
             ["model_warmup 'bad' failed", "this warmup sample asks to fail"]),
            # A file that is not there.
            (with_text({"data_type": "TYPE_STRING", "dims": [1], "input_data_file": "gone.bin"}),
             ["model_warmup 'bad'", "'gone.bin' is not a readable file inside the model folder"]),
            # A file outside the warmup folder.
            (with_text({"data_type": "TYPE_STRING", "dims": [1], "input_data_file": "../config.pbtxt"}),
             ["input_data_file of warmup 'bad' input 'TEXT'", "must be a relative path inside the model folder"]),
            # The wrong datatype, in a request's words.
            (with_text({"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}),
             ["model_warmup 'bad'", "data-type is 'INT32'"]),
        ]
        for bad, needles in cases:
            response = _load(server, bad)
            message = helpers.assert_http_error(response, range(400, 600))
            assert all(n in message for n in needles), (needles, message)
            entry = helpers.repository_index(server)["warmup_counter"]
            assert all(n in entry["reason"] for n in needles), (needles, entry)
            # The version that was serving still serves, warmed up as before.
            result = client.infer("warmup_counter", _inputs())
            assert result.as_numpy("BEFORE")[0][0] >= WARMUP_REQUESTS
            assert client.is_model_ready("warmup_counter")
    finally:
        server.stop_and_check()


ENSEMBLE = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 6 ] } ]
ensemble_scheduling {
  step [ { model_name: "identity" model_version: -1
           input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ]
}
model_warmup [ { name: "w" batch_size: 1
  inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 6 ] zero_data: true } } } ]
"""


def test_an_ensemble_with_warmup_is_refused(tmp_path_factory):
    repo = helpers.private_repo(tmp_path_factory, "warmup-ensemble")
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(ENSEMBLE)
    server = helpers.launch(tmp_path_factory, "warmup-ensemble", [repo], ["--model-control-mode", "none"], wait_for="live")
    try:
        index = helpers.wait_for_index(server, lambda idx: idx.get("chain", {}).get("state") == "UNAVAILABLE")
        assert "has no instances to warm up" in index["chain"]["reason"], index["chain"]
        assert index["identity"]["state"] == "READY", index["identity"]
    finally:
        server.stop_and_check()
