"""Time to first token and tokens per second of one text model over four
paths, measured in one run: the model's own generate_stream and the OpenAI
API's streamed completions, each on the server and through nereid-gateway.
Each round measures every path in turn at each concurrency, so drift on
this VM touches all alike; prints medians over the rounds and each OpenAI
path's TTFT as a ratio of generate_stream's over the same hops in the
same round (the gateway's against generate_stream through the gateway):
the median of the rounds' ratios and their range.

    bench/openai.py SERVER_HTTP GATEWAY_HTTP MODEL [--concurrency 1,32]
        [--requests N] [--rounds R] [--max-tokens T]

A benchmark, not a test: nothing fails on a timing. Loopback only.
"""

import argparse
import asyncio
import json
import statistics
import time

# The HTTP client the openai SDK itself depends on (3.x: httpx2).
import httpx2 as httpx

PROMPT = "The harbour"


def generate_stream_request(model, max_tokens, seed):
    """The request the OpenAI layer makes of the model (text_model.rs), token
    counts and finish reason included, so that the paths differ only by
    the layer."""
    body = {
        "text_input": PROMPT,
        "stream": True,
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "return_finish_reason": True,
        "sampling_parameters": json.dumps({"max_tokens": max_tokens, "seed": seed}),
    }
    return f"/v2/models/{model}/generate_stream", body, "text_output"


def completion_request(model, max_tokens, seed):
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "seed": seed, "stream": True}
    return "/v1/completions", body, None


async def one(client, base, request):
    path, body, field = request
    started = time.perf_counter()
    first = None
    pieces = 0
    async with client.stream("POST", base + path, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            text = event.get(field) if field else (event["choices"][0]["text"] if event.get("choices") else "")
            if text:
                pieces += 1
                if first is None:
                    first = time.perf_counter() - started
    return first, pieces


async def level(base, make, concurrency, requests, max_tokens):
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        queue = list(range(requests))
        ttfts, pieces = [], 0

        async def worker():
            nonlocal pieces
            while queue:
                seed = queue.pop()
                first, n = await one(client, base, make(seed))
                ttfts.append(first)
                pieces += n

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return statistics.median(ttfts), pieces / elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("gateway")
    parser.add_argument("model")
    parser.add_argument("--concurrency", default="1,32")
    # 2048: a level of 128 or 512 at c=32 lasts a second or less, and its
    # TTFT swayed by up to 25 % from round to round (its 32 connections'
    # set-up, the queue filling); at 2048 the rounds agree within a few %.
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    paths = {
        "generate_stream": (f"http://{args.server}", generate_stream_request),
        "openai (server)": (f"http://{args.server}", completion_request),
        "generate_stream gw": (f"http://{args.gateway}", generate_stream_request),
        "openai (gateway)": (f"http://{args.gateway}", completion_request),
    }
    results = {}
    for round_ in range(args.rounds):
        # Every other round runs the paths in reverse, so no path always
        # follows the same one.
        order = list(paths.items())[:: 1 if round_ % 2 == 0 else -1]
        for c in [int(c) for c in args.concurrency.split(",")]:
            for name, (base, build) in order:
                make = lambda seed, build=build: build(args.model, args.max_tokens, seed)  # noqa: E731
                requests = max(args.requests, c)
                ttft, rate = asyncio.run(level(base, make, c, requests, args.max_tokens))
                results.setdefault((name, c), []).append((ttft, rate))
    print(f"medians over {args.rounds} rounds, {args.max_tokens} tokens per request")
    print(f"{'path':18} {'c':>3} {'TTFT p50':>10} {'vs baseline':>12} {'per round':>20} {'tokens/s':>10}")
    for (name, c), runs in results.items():
        ttft = statistics.median(r[0] for r in runs)
        rate = statistics.median(r[1] for r in runs)
        # Each OpenAI path against generate_stream over the same hops, in
        # the same round: the median of those ratios, and their range.
        baseline = "generate_stream gw" if "gateway" in name or name.endswith(" gw") else "generate_stream"
        ratios = [run[0] / base[0] for run, base in zip(runs, results[(baseline, c)])]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(f"{name:18} {c:>3} {ttft * 1e3:>8.2f}ms {statistics.median(ratios):>11.3f}x {spread:>20} {rate:>10.0f}")

if __name__ == "__main__":
    main()
