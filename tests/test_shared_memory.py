"""Triton's system shared memory extension with tritonclient's own utilities:
regions created by tritonclient.utils.shared_memory, registered over HTTP and
gRPC, inputs read from them and outputs written into them, and every way a
client can name memory it did not register refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import helpers

INPUT_BYTES = 16 * 4


def module_and_url(server, protocol):
    if protocol == "http":
        return httpclient, server.http_url
    return grpcclient, server.grpc_url


@pytest.fixture
def regions(request):
    """Input and output regions of the test's own keys, removed afterwards."""
    suffix = f"{os.getpid()}_{request.node.name}".replace("[", "_").replace("]", "")
    handles = {
        "input": shm.create_shared_memory_region(f"in_{suffix}", f"/nereid_in_{suffix}", 2 * INPUT_BYTES),
        "output": shm.create_shared_memory_region(f"out_{suffix}", f"/nereid_out_{suffix}", 2 * INPUT_BYTES),
    }
    yield suffix, handles
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_round_trips_through_shared_memory(server, regions, protocol):
    module, url = module_and_url(server, protocol)
    client = module.InferenceServerClient(url=url)
    suffix, handles = regions
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    shm.set_shared_memory_region(handles["input"], [a, b])
    client.unregister_system_shared_memory()
    client.register_system_shared_memory(f"in_{suffix}", f"/nereid_in_{suffix}", 2 * INPUT_BYTES)
    client.register_system_shared_memory(f"out_{suffix}", f"/nereid_out_{suffix}", 2 * INPUT_BYTES)

    status = client.get_system_shared_memory_status()
    names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
    assert sorted(names) == sorted([f"in_{suffix}", f"out_{suffix}"]), status

    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(f"in_{suffix}", INPUT_BYTES)
    inputs[1].set_shared_memory(f"in_{suffix}", INPUT_BYTES, offset=INPUT_BYTES)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out_{suffix}", INPUT_BYTES)
    outputs[1].set_shared_memory(f"out_{suffix}", INPUT_BYTES, offset=INPUT_BYTES)
    result = client.infer("simple", inputs, outputs=outputs)

    for name, offset, want in (("OUTPUT0", 0, a + b), ("OUTPUT1", INPUT_BYTES, a - b)):
        output = result.get_output(name)
        assert output is not None, name
        got = shm.get_contents_as_numpy(handles["output"], np.int32, [1, 16], offset=offset)
        np.testing.assert_array_equal(got, want)
    # The data went through memory: the answer carries none.
    if protocol == "http":
        assert result.get_output("OUTPUT0")["parameters"]["shared_memory_region"] == f"out_{suffix}"
        assert "data" not in result.get_output("OUTPUT0")

    # One output in memory, the other in the answer.
    mixed = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    mixed[1].set_shared_memory(f"out_{suffix}", INPUT_BYTES)
    result = client.infer("simple", inputs, outputs=mixed)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handles["output"], np.int32, [1, 16]), a - b)

    client.unregister_system_shared_memory(f"in_{suffix}")
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert (status == [] if protocol == "http" else len(status.regions) == 0), status


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_memory_outside_a_registered_region_is_refused(server, regions, protocol):
    module, url = module_and_url(server, protocol)
    client = module.InferenceServerClient(url=url)
    suffix, handles = regions
    name = f"in_{suffix}"
    client.unregister_system_shared_memory()
    # A region larger than its object, and an object that does not exist.
    with pytest.raises(InferenceServerException) as failure:
        client.register_system_shared_memory(name, f"/nereid_in_{suffix}", 4 * INPUT_BYTES)
    assert "no object of at least 256 bytes" in str(failure.value), failure.value
    with pytest.raises(InferenceServerException) as failure:
        client.register_system_shared_memory(name, f"/nereid_missing_{suffix}", 8)
    assert "Unable to open shared memory region" in str(failure.value), failure.value

    client.register_system_shared_memory(name, f"/nereid_in_{suffix}", INPUT_BYTES, offset=INPUT_BYTES)
    with pytest.raises(InferenceServerException) as failure:
        client.register_system_shared_memory(name, f"/nereid_in_{suffix}", 8)
    assert "already in manager" in str(failure.value), failure.value

    def infer(region, byte_size, offset=0):
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(region, byte_size, offset=offset)
        inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
        return client.infer("simple", inputs)

    # Inside the region: fine. Past its end (though inside the object): refused.
    infer(name, INPUT_BYTES)
    for region, size, offset, needle in (
        (name, INPUT_BYTES, 8, "outside shared memory region"),
        (name, 2 * INPUT_BYTES, 0, "outside shared memory region"),
        ("nowhere", INPUT_BYTES, 0, "Unable to find system shared memory region: 'nowhere'"),
    ):
        with pytest.raises(InferenceServerException) as failure:
            infer(region, size, offset)
        assert needle in str(failure.value), failure.value
    # Unregistered, the region is gone for the next request.
    client.unregister_system_shared_memory(name)
    with pytest.raises(InferenceServerException) as failure:
        infer(name, INPUT_BYTES)
    assert "Unable to find system shared memory region" in str(failure.value)
    # And the server still answers.
    assert client.is_server_ready()
