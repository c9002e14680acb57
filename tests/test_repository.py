"""Model repository API: index (mode none) and load / unload (mode explicit).

The explicit-mode server is session-scoped; every test here establishes the
state it needs (load / unload) instead of relying on test order, and no test
loads `mlp_small` there, so it stays unloaded for the whole session.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from helpers import (
    ALL_EXAMPLE_MODELS,
    TIMEOUT,
    assert_http_error,
    assert_simple_works,
    broken_syntax_pbtxt,
    http_get,
    http_post,
    make_model_dir,
    post_infer,
    repository_index,
    simple_config_json,
    simple_config_pbtxt,
    simple_inputs,
    simple_json_request,
)

UNKNOWN_MODEL_STATUSES = (400, 404, 503)


# --------------------------------------------------------------------------
# Mode none: everything in examples/models is loaded
# --------------------------------------------------------------------------


def test_index_all_ready_http(server, http_client):
    index = repository_index(server)
    assert sorted(index) == sorted(ALL_EXAMPLE_MODELS)
    for name, entry in index.items():
        assert entry["state"] == "READY", entry
        assert str(entry["version"]) == "1", entry
    # tritonclient's view agrees
    names = {e["name"]: e["state"] for e in http_client.get_model_repository_index()}
    assert names == {m: "READY" for m in ALL_EXAMPLE_MODELS}


def test_index_all_ready_grpc(grpc_client):
    index = grpc_client.get_model_repository_index(client_timeout=TIMEOUT)
    states = {m.name: m.state for m in index.models}
    assert states == {m: "READY" for m in ALL_EXAMPLE_MODELS}
    versions = {m.name: m.version for m in index.models}
    assert set(versions.values()) == {"1"}


def test_index_ready_filter(server):
    index = repository_index(server, {"ready": True})
    assert sorted(index) == sorted(ALL_EXAMPLE_MODELS)


# --------------------------------------------------------------------------
# Mode explicit
# --------------------------------------------------------------------------


def _state(server, model):
    return repository_index(server).get(model, {}).get("state")


def _load(client, name, **kw):
    client.load_model(name, **kw)
    assert client.is_model_ready(name) is True


def test_explicit_startup_state(explicit_server, explicit_http_client):
    assert explicit_http_client.is_server_ready() is True
    index = repository_index(explicit_server)
    # Every model directory of the repository is listed ...
    assert set(ALL_EXAMPLE_MODELS) <= set(index)
    # ... only --load-model ones are loaded.
    assert index["identity"]["state"] == "READY"
    assert index["mlp_small"].get("state") != "READY"
    assert explicit_http_client.is_model_ready("identity") is True
    assert explicit_http_client.is_model_ready("mlp_small") is False
    ready_only = repository_index(explicit_server, {"ready": True})
    assert "identity" in ready_only and "mlp_small" not in ready_only


def test_explicit_not_loaded_model_rejects_inference(explicit_server):
    x = np.zeros((1, 256), dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "data": x.flatten().tolist()}]}
    resp = post_infer(explicit_server, "mlp_small", body)
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES)


def test_explicit_load_infer_unload(explicit_server, explicit_http_client):
    client = explicit_http_client
    _load(client, "simple")
    assert _state(explicit_server, "simple") == "READY"
    assert_simple_works(explicit_server)

    # Loading an already loaded model is fine and keeps it ready.
    _load(client, "simple")
    assert_simple_works(explicit_server)

    client.unload_model("simple")
    assert client.is_model_ready("simple") is False
    entry = repository_index(explicit_server)["simple"]
    assert entry["state"] == "UNAVAILABLE", entry
    assert entry["reason"] == "unloaded", entry

    a, b = simple_inputs(1)
    resp = post_infer(explicit_server, "simple", simple_json_request(a, b))
    assert_http_error(resp, UNKNOWN_MODEL_STATUSES)
    # Other models are untouched.
    assert client.is_model_ready("identity") is True


def test_explicit_load_with_config_override(explicit_server, explicit_http_client):
    client = explicit_http_client
    try:
        client.load_model("simple", config=json.dumps(simple_config_json(max_batch_size=4)))
        assert client.is_model_ready("simple") is True
        assert client.get_model_config("simple")["max_batch_size"] == 4

        a, b = simple_inputs(4, seed=1)
        resp = post_infer(explicit_server, "simple", simple_json_request(a, b))
        assert resp.status_code == 200, resp.text
        a, b = simple_inputs(5, seed=1)
        resp = post_infer(explicit_server, "simple", simple_json_request(a, b))
        assert_http_error(resp, 400)

        # Reload with another override: the new config is what is served.
        client.load_model("simple", config=json.dumps(simple_config_json(max_batch_size=2)))
        assert client.get_model_config("simple")["max_batch_size"] == 2
        assert_simple_works(explicit_server, batch=2)
    finally:
        client.unload_model("simple")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_invalid_config_override_is_refused_in_tritons_words(explicit_http_client, explicit_grpc_client, protocol):
    client = explicit_http_client if protocol == "http" else explicit_grpc_client
    with pytest.raises(InferenceServerException) as failure:
        client.load_model("simple", config='{"max_batch_size": "many"')
    message = str(failure.value)
    assert "failed to load 'simple', Invalid config override:" in message, message
    assert client.is_model_ready("identity") is True


def test_explicit_load_unload_grpc(explicit_server, explicit_grpc_client):
    client = explicit_grpc_client
    client.load_model("identity_fp16", client_timeout=TIMEOUT)
    assert client.is_model_ready("identity_fp16", client_timeout=TIMEOUT) is True
    states = {m.name: m.state for m in client.get_model_repository_index(client_timeout=TIMEOUT).models}
    assert states["identity_fp16"] == "READY"

    client.unload_model("identity_fp16", client_timeout=TIMEOUT)
    assert client.is_model_ready("identity_fp16", client_timeout=TIMEOUT) is False
    entries = {m.name: m for m in client.get_model_repository_index(client_timeout=TIMEOUT).models}
    assert entries["identity_fp16"].state == "UNAVAILABLE"
    assert entries["identity_fp16"].reason == "unloaded"


def test_explicit_load_config_override_grpc(explicit_grpc_client):
    client = explicit_grpc_client
    try:
        client.load_model("simple", config=json.dumps(simple_config_json(max_batch_size=4)), client_timeout=TIMEOUT)
        cfg = client.get_model_config("simple", client_timeout=TIMEOUT).config
        assert cfg.max_batch_size == 4
    finally:
        client.unload_model("simple", client_timeout=TIMEOUT)


def test_explicit_load_unknown_model(explicit_server, explicit_http_client):
    resp = http_post(explicit_server, "/v2/repository/models/no_such_model/load", data=b"{}")
    assert_http_error(resp, range(400, 600))
    with pytest.raises(InferenceServerException):
        explicit_http_client.load_model("no_such_model")
    assert explicit_http_client.is_server_live() is True
    assert explicit_http_client.is_model_ready("identity") is True


def test_explicit_load_model_added_at_runtime(explicit_server, explicit_http_client):
    repo = explicit_server.repos[0]
    make_model_dir(repo, "late_simple", simple_config_pbtxt("late_simple"))
    try:
        _load(explicit_http_client, "late_simple")
        assert repository_index(explicit_server)["late_simple"]["state"] == "READY"
        assert_simple_works(explicit_server, model="late_simple")
    finally:
        explicit_http_client.unload_model("late_simple")


def test_explicit_load_broken_config(explicit_server, explicit_http_client):
    repo = explicit_server.repos[0]
    make_model_dir(repo, "late_broken", broken_syntax_pbtxt("late_broken"))
    resp = http_post(explicit_server, "/v2/repository/models/late_broken/load", data=b"{}")
    msg = assert_http_error(resp, range(400, 600))
    assert "late_broken" in msg or "config" in msg.lower(), msg
    assert explicit_http_client.is_model_ready("late_broken") is False
    entry = repository_index(explicit_server)["late_broken"]
    assert entry["state"] == "UNAVAILABLE", entry
    assert "config" in entry["reason"].lower(), entry
    # The server and its loaded models are unaffected.
    assert explicit_http_client.is_model_ready("identity") is True
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    inp = httpclient.InferInput("INPUT0", [1, 6], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(explicit_http_client.infer("identity", [inp]).as_numpy("OUTPUT0"), x)


def test_explicit_unload_then_load_again(explicit_server, explicit_http_client):
    client = explicit_http_client
    _load(client, "identity_bytes")
    client.unload_model("identity_bytes")
    assert client.is_model_ready("identity_bytes") is False
    _load(client, "identity_bytes")
    assert _state(explicit_server, "identity_bytes") == "READY"
    client.unload_model("identity_bytes")


# --------------------------------------------------------------------------
# Mode none refuses load / unload
# --------------------------------------------------------------------------


def test_mode_none_rejects_unload(small_server):
    # Uses the small (mode none) server so a wrongly-accepted unload cannot
    # disturb the main server's models.
    resp = http_post(small_server, "/v2/repository/models/identity_fp16/unload", data=b"{}")
    assert_http_error(resp, range(400, 600))
    resp = http_post(small_server, "/v2/repository/models/identity_fp16/load", data=b"{}")
    assert_http_error(resp, range(400, 600))
    assert http_get(small_server, "/v2/models/identity_fp16/ready").status_code == 200, (
        "identity_fp16 must stay loaded in mode none"
    )
