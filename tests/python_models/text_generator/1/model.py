"""A small text generator that behaves like an LLM server's model: the
inputs and outputs of Triton's vLLM backend, a byte-level BPE tokenizer
(the `tokenizers` library) trained at start-up on the text below, and a
next-token rule drawn from the token bigrams of that text with numpy's
seeded generator. One token per response when streaming; max_tokens, stop
strings, temperature, seed and cancellation are honoured; every token is
counted in the custom metric text_generator_tokens_total. No weights from
a model hub."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = """
The harbour wakes before the town does. Boats come in with the tide, and
the gulls follow them in wide circles over the water. A baker opens her
shop at the corner and the smell of bread drifts down to the quay. The
fishermen carry their crates past the market, where the stalls are still
half empty. By seven the streets are full of people going to work, and the
first bus climbs the hill toward the old lighthouse. In the afternoon the
wind turns, the sea grows grey, and the boats go out again. At night the
lighthouse sweeps its light across the bay, and the town sleeps under it.
People here say the sea keeps its own time, and the town keeps the sea's.
"""


def _flag(request, name, default=False):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().flat[0])


def _text(request, name, default=""):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().flat[0]
    return value.decode() if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("token_delay_ms", {}).get("string_value", "0")
        self.delay = float(delay) / 1000
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tokenizer.train_from_iterator([CORPUS], trainer)
        self.tokenizer = tokenizer
        ids = tokenizer.encode(CORPUS).ids
        # Each token's successors in the text, with their counts.
        followers = {}
        for a, b in zip(ids, ids[1:]):
            followers.setdefault(a, {}).setdefault(b, 0)
            followers[a][b] += 1
        self.followers = {
            a: (np.array(list(f.keys())), np.array(list(f.values()), dtype=np.float64)) for a, f in followers.items()
        }
        self.first = ids[0]
        family = pb_utils.MetricFamily(
            name="text_generator_tokens_total",
            description="Tokens the text generator has generated",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.tokens = family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        # Every request of the batch generates at once, each on its thread.
        threads = [threading.Thread(target=self.generate, args=(r,), daemon=True) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return None

    def next_token(self, last, temperature, rng):
        choices, counts = self.followers.get(last, self.followers[self.first])
        if temperature <= 0:
            return int(choices[np.argmax(counts)])
        weights = counts ** (1.0 / temperature)
        return int(rng.choice(choices, p=weights / weights.sum()))

    def generate(self, request):
        sender = request.get_response_sender()
        try:
            self._generate(request, sender)
        except Exception as e:  # the request fails, the model goes on
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def _generate(self, request, sender):
        prompt = _text(request, "text_input")
        sampling = json.loads(_text(request, "sampling_parameters", "{}") or "{}")
        stream = _flag(request, "stream")
        exclude_input = _flag(request, "exclude_input_in_output")
        counts = _flag(request, "return_num_input_tokens") or _flag(request, "return_num_output_tokens")
        max_tokens = int(sampling.get("max_tokens", 16))
        temperature = float(sampling.get("temperature", 1.0))
        stop = sampling.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        rng = np.random.default_rng(sampling.get("seed"))
        pb_utils.Logger.log_info("text_generator prompt: " + json.dumps(prompt))

        prompt_ids = self.tokenizer.encode(prompt).ids
        last = prompt_ids[-1] if prompt_ids else self.first
        generated = []
        text = ""
        sent = 0  # characters of text already sent
        unsent_tokens = 0
        reason = "length"

        def respond(chunk, tokens, final_reason=None, final=False):
            outputs = [pb_utils.Tensor("text_output", np.array([chunk.encode()], dtype=np.object_))]
            if counts:
                outputs.append(pb_utils.Tensor("num_input_tokens", np.array([len(prompt_ids)], dtype=np.uint32)))
                outputs.append(pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.uint32)))
            if final_reason is not None:
                outputs.append(pb_utils.Tensor("finish_reason", np.array([final_reason.encode()], dtype=np.object_)))
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)

        prefix = "" if exclude_input else prompt
        for _ in range(max_tokens):
            if request.is_cancelled():
                reason = "cancelled"
                break
            last = self.next_token(last, temperature, rng)
            generated.append(last)
            unsent_tokens += 1
            self.tokens.increment(1)
            text = self.tokenizer.decode(generated)
            cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
                reason = "stop"
                break
            if stream:
                # Hold back an end that may be the start of a stop string.
                held = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
                if len(text) - held > sent:
                    respond(prefix + text[sent : len(text) - held], unsent_tokens)
                    prefix = ""
                    sent = len(text) - held
                    unsent_tokens = 0
            if self.delay:
                time.sleep(self.delay)
        if reason == "cancelled":
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if stream:
            respond(prefix + text[sent:], unsent_tokens, reason, final=True)
        else:
            respond(prefix + text, len(generated), reason, final=True)
