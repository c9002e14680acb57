"""Stateful models through Triton's own clients.

`accumulate_int32` (examples/models) keeps a running sum per sequence;
tritonclient's sequence_id / sequence_start / sequence_end drive it over
both protocols. Silero VAD, wrapped by examples/silero_vad_model.py, is served
as a stateful model: each audio stream is a sequence, the server carries
its LSTM state and audio context, and the probabilities of many streams
at once must equal the model run directly, chunk by chunk, state carried
by hand.
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import helpers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import silero_vad_model as silero_vad  # noqa: E402

ACCUMULATE = "accumulate_int32"


def _client(module, server):
    if module is grpcclient:
        return grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient.InferenceServerClient(server.http_url, network_timeout=helpers.TIMEOUT)


def _add(client, module, sequence_id, value, start=False, end=False) -> int:
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(ACCUMULATE, [inp], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0][0])


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_interleaved_sequences_over_tritonclient(server, module):
    client = _client(module, server)
    base = 1000 if module is grpcclient else 2000
    ids = [base + 1, base + 2, f"text-{base}"]
    sums = {i: 0 for i in ids}
    for step in range(5):
        for n, sequence_id in enumerate(ids):
            value = (n + 1) * 10 + step
            sums[sequence_id] += value
            got = _add(client, module, sequence_id, value, start=step == 0, end=step == 4)
            assert got == sums[sequence_id], (sequence_id, step)
    client.close()


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_sequence_errors_in_tritons_words(server, module):
    client = _client(module, server)
    sequence_id = 3000 if module is grpcclient else 4000
    with pytest.raises(InferenceServerException) as err:
        _add(client, module, sequence_id, 1)
    assert "must specify the START flag on the first request of the sequence" in str(err.value)
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer(ACCUMULATE, [inp])
    assert "must specify a non-zero or non-empty correlation ID" in str(err.value)
    # The sequence that ended takes no more requests; a new START is fine.
    assert _add(client, module, sequence_id, 5, start=True, end=True) == 5
    with pytest.raises(InferenceServerException) as err:
        _add(client, module, sequence_id, 1, end=True)
    assert "START" in str(err.value)
    assert _add(client, module, sequence_id, 7, start=True, end=True) == 7
    client.close()


# --------------------------------------------------------------------------
# Silero VAD
# --------------------------------------------------------------------------

STREAMS = 24
SECONDS = 2.0


@pytest.fixture(scope="module")
def vad_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("vad") / "models"
    silero_vad.write(repo, max_batch_size=16, instances=1)
    srv = helpers.launch(tmp_path_factory, "vad", [repo], ["--exit-timeout-secs", "10"])
    yield srv
    srv.stop_and_check()


def _speechlike(n: int, seed: int) -> np.ndarray:
    """A voiced signal with speech's structure: harmonics of a moving
    pitch, shaped by two formants that glide from vowel to vowel, in
    syllables four times a second with noise bursts between them."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / silero_vad.SAMPLE_RATE
    f0 = (120 + 15 * seed % 60) * (1 + 0.15 * np.sin(2 * np.pi * 1.3 * t))
    phase = 2 * np.pi * np.cumsum(f0) / silero_vad.SAMPLE_RATE
    syllables = 4.0
    f1 = 600 + 250 * np.sin(np.pi * syllables * t + seed)
    f2 = 1500 + 600 * np.sin(2 * np.pi * syllables / 3 * t + 2 * seed)
    voiced = np.zeros(n)
    for k in range(1, 40):
        fk = k * f0
        gain = np.exp(-(((fk - f1) / 120) ** 2)) + 0.7 * np.exp(-(((fk - f2) / 160) ** 2))
        voiced += gain * np.sin(k * phase)
    envelope = np.clip(np.sin(2 * np.pi * syllables * t), 0, None) ** 0.6
    bursts = 0.05 * rng.standard_normal(n) * (np.clip(-np.sin(2 * np.pi * syllables * t), 0, None) > 0.8)
    return 0.4 * voiced / np.abs(voiced).max() * envelope + bursts


def _audio(seed: int) -> np.ndarray:
    """Silence, a tone, speech-like sound, silence: SECONDS of 16 kHz audio
    as chunks of 512 samples (each part a whole number of chunks)."""
    rng = np.random.default_rng(seed)
    part = int(silero_vad.SAMPLE_RATE * SECONDS / 4) // silero_vad.CHUNK * silero_vad.CHUNK
    t = np.arange(part) / silero_vad.SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t)
    silence = lambda: 0.001 * rng.standard_normal(part)  # noqa: E731
    audio = np.concatenate([silence(), tone, _speechlike(part, seed), silence()]).astype(np.float32)
    return audio.reshape(-1, silero_vad.CHUNK)


def _reference(chunks: np.ndarray) -> np.ndarray:
    """The shipped model, run directly chunk by chunk: the state and the
    64-sample context carried by hand, as the silero-vad package does."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(silero_vad.shipped_model()), providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, silero_vad.CONTEXT), np.float32)
    sr = np.array(silero_vad.SAMPLE_RATE, dtype=np.int64)
    out = []
    for chunk in chunks:
        x = np.concatenate([context, chunk[None]], axis=1)
        probability, state = session.run(None, {"input": x, "state": state, "sr": sr})
        context = x[:, -silero_vad.CONTEXT:]
        out.append(probability[0, 0])
    return np.array(out, dtype=np.float32)


def _stream(server, index: int, chunks: np.ndarray) -> np.ndarray:
    module = grpcclient if index % 2 == 0 else httpclient
    client = _client(module, server)
    out = []
    try:
        for i, chunk in enumerate(chunks):
            inp = module.InferInput("audio", [1, silero_vad.CHUNK], "FP32")
            inp.set_data_from_numpy(chunk[None])
            result = client.infer(
                "silero_vad", [inp],
                sequence_id=f"stream-{index}" if index % 3 == 0 else 5000 + index,
                sequence_start=i == 0,
                sequence_end=i == len(chunks) - 1,
            )
            out.append(result.as_numpy("probability")[0, 0])
    finally:
        client.close()
    return np.array(out, dtype=np.float32)


def test_silero_vad_streams_match_the_model_run_directly(vad_server):
    audio = [_audio(seed) for seed in range(STREAMS)]
    with ThreadPoolExecutor(max_workers=STREAMS) as pool:
        served = list(pool.map(lambda i: _stream(vad_server, i, audio[i]), range(STREAMS)))
    for index, (chunks, probabilities) in enumerate(zip(audio, served)):
        expected = _reference(chunks)
        np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-5, err_msg=f"stream {index}")
    # Not a trivial match: each stream's speech-like part is heard as
    # speech, and its leading silence is not.
    part = len(audio[0]) // 4
    for index, probabilities in enumerate(served):
        assert probabilities[2 * part : 3 * part].max() > 0.5, f"stream {index}: {probabilities}"
        assert probabilities[:part].max() < 0.5, f"stream {index}: {probabilities}"
    stats = helpers.http_get(vad_server, "/v2/models/silero_vad/stats").json()["model_stats"][0]
    assert int(stats["inference_count"]) == sum(len(a) for a in audio)
    assert int(stats["execution_count"]) < int(stats["inference_count"]), stats
