"""What Triton's own client examples do first, with the real tritonclient:
the shared-memory examples unregister every CUDA region before they start
(also on a machine without a GPU, where Triton answers with success and an
empty status), simple_grpc_custom_repeat sends the repeat backend its WAIT
input, and users set the ONNX Runtime backend's defaults with
--backend-config, which auto-complete then follows as Triton's ONNX Runtime
backend does."""

import base64
import queue
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import helpers

# A cudaIpcMemHandle_t is 64 bytes; the clients take it base64-encoded (as
# tritonclient.utils.cuda_shared_memory.get_raw_handle gives it).
FAKE_HANDLE = base64.b64encode(bytes(range(64)))


def _clients(server):
    return [
        httpclient.InferenceServerClient(server.http_url),
        grpcclient.InferenceServerClient(server.grpc_url),
    ]


def test_cuda_shared_memory_without_a_gpu_answers_as_triton_does(server):
    for client in _clients(server):
        # Every shared-memory example's first lines.
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("never-registered")
        status = client.get_cuda_shared_memory_status()
        regions = status if isinstance(status, list) else list(status.regions)
        assert regions == [], status
        with pytest.raises(InferenceServerException) as refused:
            client.register_cuda_shared_memory("input_data", FAKE_HANDLE, 0, 64)
        message = str(refused.value)
        assert "'input_data'" in message and "no GPU" in message, message
        with pytest.raises(InferenceServerException) as short:
            client.register_cuda_shared_memory("short", base64.b64encode(b"abc"), 0, 64)
        assert "got 3 bytes" in str(short.value), short.value


def test_cuda_errors_over_http_are_tritons_naming_the_field(server):
    path = "/v2/cudasharedmemory/region/r/register"
    resp = helpers.http_post(server, path, json={"device_id": 0, "byte_size": 64})
    helpers.assert_http_error(resp, 400, contains=["'raw_handle'"])
    resp = helpers.http_post(server, path, json={"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64})
    helpers.assert_http_error(resp, 400, contains=["'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"])
    resp = helpers.http_post(server, "/v2/cudasharedmemory/unregister")
    assert resp.status_code == 200, resp.text
    resp = helpers.http_get(server, "/v2/cudasharedmemory/region/r/status")
    helpers.assert_http_error(resp, 404, contains=["Unable to find cuda shared memory region: 'r'"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_system_shared_memory_example_runs_after_its_cuda_unregister(server, protocol):
    # simple_{http,grpc}_shm_client, line for line in what it asks of the server.
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    size = a.nbytes
    key = f"/nereid_example_{protocol}"
    inputs_handle = shm.create_shared_memory_region(f"input_data_{protocol}", key + "_in", size * 2)
    outputs_handle = shm.create_shared_memory_region(f"output_data_{protocol}", key + "_out", size * 2)
    try:
        shm.set_shared_memory_region(inputs_handle, [a])
        shm.set_shared_memory_region(inputs_handle, [b], offset=size)
        client.register_system_shared_memory(f"input_data_{protocol}", key + "_in", size * 2)
        client.register_system_shared_memory(f"output_data_{protocol}", key + "_out", size * 2)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(f"input_data_{protocol}", size)
        inputs[1].set_shared_memory(f"input_data_{protocol}", size, offset=size)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"output_data_{protocol}", size)
        outputs[1].set_shared_memory(f"output_data_{protocol}", size, offset=size)
        client.infer("simple", inputs, outputs=outputs)
        total = shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16])
        difference = shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16], offset=size)
        np.testing.assert_array_equal(total, a + b)
        np.testing.assert_array_equal(difference, a - b)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs_handle)
        shm.destroy_shared_memory_region(outputs_handle)


def test_the_custom_repeat_example_sends_wait_and_gets_every_value(server):
    # simple_grpc_custom_repeat: IN, DELAY and WAIT to repeat_int32 over a
    # stream (its delays shortened), OUT only asked for.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = np.arange(100, 110, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(values)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.full(len(values), 5, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([100], dtype=np.uint32))
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        received = []
        for _ in values:
            result, error = results.get(timeout=helpers.TIMEOUT)
            assert error is None, error
            received.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    assert received == list(values), received


def _config(server, model):
    return httpclient.InferenceServerClient(server.http_url).get_model_config(model)


def test_backend_config_sets_autocompletes_default_and_the_warning_says_so(tmp_path_factory):
    repo = tmp_path_factory.mktemp("backend-config") / "models"
    helpers.make_model_dir(repo, "filled", None)
    helpers.make_model_dir(repo, "given", 'platform: "onnxruntime_onnx"\nmax_batch_size: 2\n')
    srv = helpers.launch(
        tmp_path_factory, "backend-config", [repo], ["--backend-config=onnxruntime,default-max-batch-size=8"]
    )
    try:
        filled = _config(srv, "filled")
        assert filled["max_batch_size"] == 8, filled
        assert "dynamic_batching" in filled, filled
        # Given, not filled: still batched dynamically, as Triton's ONNX Runtime backend does.
        given = _config(srv, "given")
        assert given["max_batch_size"] == 2, given
        assert "dynamic_batching" in given, given
        log = srv.output()
        assert "autofilled max_batch_size to 8 for model 'filled'" in log, log
        assert "for model 'given'" not in log, log
    finally:
        srv.stop_and_check()


@pytest.mark.parametrize(
    "value, needle",
    [
        ("tensorrt,default-max-batch-size=4", "no backend of this server is named 'tensorrt'"),
        ("onnxruntime,max-batch=4", "backend 'onnxruntime' has no setting 'max-batch'"),
        ("onnxruntime,default-max-batch-size", "expected <backend>,<setting>=<value>"),
    ],
)
def test_an_unknown_backend_config_is_refused_at_start(value, needle):
    run = subprocess.run(
        [str(helpers.server_binary()), "--model-repository", str(helpers.EXAMPLES_MODELS), f"--backend-config={value}"],
        capture_output=True,
        text=True,
        timeout=helpers.TIMEOUT,
    )
    assert run.returncode == 2, run.stderr
    assert "--backend-config" in run.stderr and needle in run.stderr, run.stderr
