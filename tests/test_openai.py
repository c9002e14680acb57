"""The OpenAI-compatible API, with the real `openai` client, on a Python
text generator with the inputs and outputs of Triton's vLLM backend
(tests/python_models/text_generator): models, completions and chat,
streamed and whole, usage, stop strings, errors, metrics, and a client
that goes away mid-stream; directly and through nereid-gateway."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import helpers

TEST_MODELS = Path(__file__).resolve().parent / "python_models"

IDENTITY = """name: "identity_int32"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""


def _copy_generator(repo: Path, name: str, delay_ms: int = 0) -> Path:
    folder = repo / name
    shutil.copytree(TEST_MODELS / "text_generator", folder)
    config = (folder / "config.pbtxt").read_text()
    config = config.replace('name: "text_generator"', f'name: "{name}"')
    config = config.replace('string_value: "0"', f'string_value: "{delay_ms}"')
    (folder / "config.pbtxt").write_text(config)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openai") / "models"
    repo.mkdir()
    _copy_generator(repo, "text_generator")
    _copy_generator(repo, "slow_generator", delay_ms=30)
    chat = _copy_generator(repo, "chat_generator")
    (chat / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role | upper }}] {{ m.content.strip() }}\n{% endfor %}[ASSISTANT]"
    )
    (repo / "identity_int32" / "1").mkdir(parents=True)
    (repo / "identity_int32" / "config.pbtxt").write_text(IDENTITY)
    logs = tmp_path_factory.mktemp("openai-logs")
    srv = helpers.NereidServer(
        [repo], ["--model-control-mode", "none", "--exit-timeout-secs", "10"], log_path=logs / "server.log"
    ).start()
    yield srv
    srv.stop_and_check()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def gateway(server):
    """nereid-gateway on loopback in front of the server, with static
    endpoints: chat_generator in namespace ml, the others in default."""
    binary = helpers.server_binary().parent / "nereid-gateway"
    pod = f"{server.http_url},{server.grpc_url}"
    command = [str(binary), "--address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    for model in ("text_generator", "slow_generator", "ml/chat_generator"):
        command += ["--endpoint", f"{model}={pod}"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=dict(os.environ, NO_COLOR="1"))
    lines = []
    address = None
    deadline = time.monotonic() + 30
    while address is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        address = re.search(r"listening http=(\S+)", line)
    assert address, "nereid-gateway did not start:\n" + "".join(lines)
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    yield address.group(1)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def via_gateway(gateway):
    return openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(server) -> dict:
    text = requests.get(server.metrics_url, timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict, family: str, suffix: str = "", **labels) -> float:
    for sample in families[family].samples:
        if sample.name == family + suffix and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"no {family}{suffix} with {labels}")


def _stream_concurrently(client, prompt: str, max_tokens: int, count: int, timeout: float) -> dict:
    """{seed: the streamed text} of `count` streamed completions at once."""
    results = {}

    def ask(i: int) -> None:
        chunks = client.completions.create(
            model="text_generator", prompt=prompt, max_tokens=max_tokens, seed=i, stream=True
        )
        results[i] = "".join(c.choices[0].text for c in chunks)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return results


def _slow_generated(server) -> float:
    """Tokens slow_generator has made, by its own counter."""
    return _sample(_metrics(server), "text_generator_tokens", "_total", model="slow_generator")


def _leave_a_long_stream(client) -> None:
    """Reads 3 chunks of a stream of 2000 tokens (30 ms each: a minute), then goes away."""
    stream = client.completions.create(model="slow_generator", prompt="The", max_tokens=2000, stream=True)
    for received, _ in enumerate(stream, start=1):
        if received == 3:
            break
    stream.close()


def _generation_stopped(server, why: str) -> float:
    """Waits a second, then checks the counter stays put for another; its value."""
    time.sleep(1.0)
    stopped_at = _slow_generated(server)
    time.sleep(1.0)
    assert _slow_generated(server) == stopped_at, why
    return stopped_at


def _prompted(server, prompt: str) -> None:
    """Waits until the model has logged that it saw `prompt`."""
    logged = "text_generator prompt: " + json.dumps(prompt)
    deadline = time.monotonic() + 10
    while logged not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logged in server.output(), f"the model never saw {prompt!r}"


def test_models_lists_the_text_models(client):
    ids = {m.id for m in client.models.list().data}
    assert {"text_generator", "slow_generator", "chat_generator"} <= ids
    assert "identity_int32" not in ids, "a model without text_input/text_output is not listed"
    assert client.models.retrieve("text_generator").id == "text_generator"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no_such_model")
    with pytest.raises(openai.BadRequestError):
        client.models.retrieve("identity_int32")


def test_a_completion_streamed_equals_the_whole_one_for_the_same_seed(client):
    args = dict(model="text_generator", prompt="The boats", max_tokens=12, seed=11, temperature=0.8)
    whole = client.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    assert whole.object == "text_completion" and whole.model == "text_generator"

    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 1, "the text came in pieces"
    assert "".join(texts) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == whole.usage.model_dump()

    # Another seed, another text.
    other = client.completions.create(**{**args, "seed": 12})
    assert other.choices[0].text != choice.text


def test_a_chat_uses_the_models_template_and_streams_the_same_answer(client, server):
    messages = [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Tell me about the harbour."},
    ]
    whole = client.chat.completions.create(model="chat_generator", messages=messages, max_tokens=10, seed=3)
    answer = whole.choices[0].message
    assert answer.role == "assistant" and answer.content
    assert whole.object == "chat.completion"
    assert whole.usage.completion_tokens == 10
    # The prompt the model saw is the template's rendering.
    _prompted(server, "[SYSTEM] Be brief.\n[USER] Tell me about the harbour.\n[ASSISTANT]")

    chunks = list(
        client.chat.completions.create(model="chat_generator", messages=messages, max_tokens=10, seed=3, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)

    # Without a template of its own, the documented default.
    client.chat.completions.create(model="text_generator", messages=messages[1:], max_tokens=2)
    _prompted(server, "<|user|>\nTell me about the harbour.\n<|assistant|>\n")


def test_a_chat_template_is_read_once_per_load(tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    template = _copy_generator(repo, "chat_generator") / "chat_template.jinja"
    template.write_text("first: {{ messages[-1].content }}")
    srv = helpers.NereidServer(
        [repo], ["--model-control-mode", "explicit", "--load-model", "chat_generator"], log_path=tmp_path / "server.log"
    ).start()
    try:
        api = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
        ask = dict(model="chat_generator", max_tokens=1)
        api.chat.completions.create(messages=[{"role": "user", "content": "one"}], **ask)
        _prompted(srv, "first: one")
        # The loaded model keeps the template it was loaded with...
        template.write_text("second: {{ messages[-1].content }}")
        api.chat.completions.create(messages=[{"role": "user", "content": "two"}], **ask)
        _prompted(srv, "first: two")
        # ...and a reload reads the folder again.
        answer = requests.post(f"{srv.base_url}/v2/repository/models/chat_generator/load", timeout=60)
        assert answer.status_code == 200, answer.text
        api.chat.completions.create(messages=[{"role": "user", "content": "three"}], **ask)
        _prompted(srv, "second: three")
    finally:
        srv.stop_and_check()


def test_a_stop_string_ends_the_text_before_it(client):
    args = dict(model="text_generator", prompt="The harbour", max_tokens=40, temperature=0)
    full = client.completions.create(**args).choices[0].text
    words = re.findall(r" \w+", full)
    assert words, full
    stop = words[len(words) // 2]
    cut = full.index(stop)
    stopped = client.completions.create(**args, stop=[stop]).choices[0]
    assert (stopped.text, stopped.finish_reason) == (full[:cut], "stop")
    streamed = client.completions.create(**args, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == full[:cut]


def test_bad_requests_get_openais_errors(client, server):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no_such_model", prompt="x")
    assert missing.value.code == "model_not_found" and "no_such_model" in missing.value.message
    with pytest.raises(openai.BadRequestError) as not_text:
        client.completions.create(model="identity_int32", prompt="x")
    assert "text_input" in not_text.value.message
    with pytest.raises(openai.BadRequestError) as two:
        client.completions.create(model="text_generator", prompt="x", n=2)
    assert two.value.param == "n"
    with pytest.raises(openai.BadRequestError) as batch:
        client.completions.create(model="text_generator", prompt=["a", "b"])
    assert batch.value.param == "prompt"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="text_generator", messages=[])
    answer = requests.post(f"{server.base_url}/v1/completions", data=b"{not json", timeout=10)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and "not a valid request" in error["message"]


def test_a_client_that_goes_away_stops_the_generation(server, client):
    before = _slow_generated(server) if "text_generator_tokens" in _metrics(server) else 0.0
    _leave_a_long_stream(client)
    stopped_at = _generation_stopped(server, "the model went on generating for nobody")
    assert stopped_at - before < 200, (before, stopped_at)

    # A client that gives up on a whole answer: the model, which sends
    # nothing until its end, learns of it all the same.
    impatient = client.with_options(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model="slow_generator", prompt="The", max_tokens=2000)
    _generation_stopped(server, "the model went on generating a whole answer for nobody")


def test_concurrent_streams_all_complete_and_are_measured(server, client):
    results = _stream_concurrently(client, "The town", max_tokens=8, count=12, timeout=60)
    assert sorted(results) == list(range(12)) and all(results.values())

    families = _metrics(server)
    assert _sample(families, "nv_llm_time_to_first_token_seconds", "_count", model="text_generator") >= 12
    assert _sample(families, "nv_llm_inter_token_latency_seconds", "_count", model="text_generator") > 0
    assert _sample(families, "nv_llm_generation_tokens", "_total", model="text_generator") >= 12 * 8
    assert _sample(families, "nv_llm_prompt_tokens", "_total", model="text_generator") > 0


def test_the_gateway_routes_by_the_bodys_model_and_keeps_streams_open(client, via_gateway):
    ids = {m.id for m in via_gateway.models.list().data}
    assert {"text_generator", "slow_generator", "chat_generator"} <= ids
    assert via_gateway.models.retrieve("ml/chat_generator").id == "ml/chat_generator"
    assert via_gateway.models.retrieve("chat_generator").id == "chat_generator"
    with pytest.raises(openai.NotFoundError):
        via_gateway.models.retrieve("other/chat_generator")
    args = dict(model="text_generator", prompt="The lighthouse", max_tokens=10, seed=5)
    direct = client.completions.create(**args)
    routed = via_gateway.completions.create(**args)
    assert routed.choices[0].text == direct.choices[0].text
    assert routed.usage.model_dump() == direct.usage.model_dump()
    streamed = via_gateway.completions.create(**args, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == direct.choices[0].text
    # Another namespace: named ns/name, sent to the pod by its plain name.
    messages = [{"role": "user", "content": "Hello"}]
    chat = via_gateway.chat.completions.create(model="ml/chat_generator", messages=messages, max_tokens=4, seed=1)
    assert chat.choices[0].message.content == client.chat.completions.create(
        model="chat_generator", messages=messages, max_tokens=4, seed=1
    ).choices[0].message.content
    with pytest.raises(openai.NotFoundError) as missing:
        via_gateway.completions.create(model="no_such_model", prompt="x")
    assert missing.value.code == "model_not_found" and "no_such_model" in missing.value.message
    with pytest.raises(openai.BadRequestError):
        via_gateway.completions.create(model="", prompt="x")


def test_streams_through_the_gateway_all_complete_and_a_disconnect_still_stops_the_model(server, via_gateway):
    results = _stream_concurrently(via_gateway, "The sea", max_tokens=6, count=100, timeout=120)
    assert sorted(results) == list(range(100)) and all(results.values())
    _leave_a_long_stream(via_gateway)
    _generation_stopped(server, "the model went on generating after the client left the gateway")
