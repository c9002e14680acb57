"""The real `openai` client against a serving pod and the cluster's gateway,
as operator/tests/e2e/openai.rs runs it: python openai_client.py POD_URL
GATEWAY_URL MODEL. Every check is an assertion; the last line of stdout is
a summary the scenario prints."""

import sys
import threading
import time

import openai

pod_url, gateway_url, model = sys.argv[1:4]


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


def answers(base: str) -> dict:
    """Lists the models, then asks for a completion and a chat, whole and
    streamed with the same seed; checks they agree and that usage adds up.
    Returns the texts, to compare across endpoints."""
    api = client(base)
    ids = {m.id for m in api.models.list().data}
    assert model in ids, (base, ids)
    assert api.models.retrieve(model).id == model

    args = dict(model=model, prompt="The harbour", max_tokens=12, seed=7, temperature=0.8)
    whole = api.completions.create(**args)
    text = whole.choices[0].text
    assert text and whole.choices[0].finish_reason == "length", (base, whole)
    usage = whole.usage
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 0, (base, usage)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, (base, usage)
    chunks = list(api.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1, (base, "the text came in one piece", pieces)
    assert "".join(pieces) == text, (base, pieces, text)
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == usage.model_dump(), (base, chunks[-1])

    messages = [{"role": "user", "content": "Tell me about the lighthouse."}]
    chat = api.chat.completions.create(model=model, messages=messages, max_tokens=8, seed=3)
    said = chat.choices[0].message
    assert said.role == "assistant" and said.content, (base, chat)
    assert chat.usage.completion_tokens == 8, (base, chat.usage)
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 8, (base, chat.usage)
    streamed = list(api.chat.completions.create(model=model, messages=messages, max_tokens=8, seed=3, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant", (base, streamed[0])
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == said.content, (base, streamed)
    assert streamed[-1].choices[0].finish_reason == "length", (base, streamed[-1])

    try:
        api.completions.create(model="no_such_model", prompt="x")
        raise AssertionError(f"{base}: a completion for a model that does not exist succeeded")
    except openai.NotFoundError as error:
        assert error.code == "model_not_found", (base, error)
    return {"completion": text, "chat": said.content}


def streams_through(base: str, count: int) -> float:
    """`count` streamed completions at once; each must end with max_tokens
    tokens. Returns how long they took, in seconds."""
    api = client(base)
    done, failures = {}, []

    def ask(seed: int) -> None:
        try:
            chunks = list(
                api.completions.create(
                    model=model,
                    prompt="The sea",
                    max_tokens=6,
                    seed=seed,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            assert chunks[-1].usage.completion_tokens == 6, chunks[-1]
            done[seed] = "".join(c.choices[0].text for c in chunks if c.choices)
        except Exception as error:  # reported below, with the seed
            failures.append(f"stream {seed}: {error!r}")

    started = time.monotonic()
    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:5]
    assert sorted(done) == list(range(count)) and all(done.values()), f"{len(done)} of {count} streams completed"
    return time.monotonic() - started


direct = answers(pod_url)
routed = answers(gateway_url)
assert routed == direct, ("the gateway's answers differ from the pod's for the same seeds", routed, direct)
took = streams_through(gateway_url, 100)
print(f"openai: the pod and the gateway agree; 100 concurrent streams through the gateway completed in {took:.1f} s")
