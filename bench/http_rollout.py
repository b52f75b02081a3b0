"""Rollout samples per second: miles' batched engine call against one HTTP request per sample through sglang-router
(the path of every custom generate function), on the embedded default, for the torch engine and for SGLang; and the
router's own cost per request.

A rollout is the embedded run's: --prompts prompts x --samples samples, at most --max-response-len new tokens,
temperature 1. Each engine runs as in a run: a Ray actor (``miles.rollout.engine_actor``) serving its HTTP front
(``miles.rollout.engine_server``), behind a real sglang-router started here by ``miles.rollout.router``; this process
plays the rollout manager:

- batched: ``actor.generate.remote(prompts, samples, ...)``, the call the rollout manager makes without a custom
  function;
- router: every sample of the rollout as its own ``POST /generate`` through the router, all at once, with
  ``miles.utils.http_utils.post`` on one event loop, as the rollout manager awaits a generate function on every
  sample;
- direct: the same requests sent to the engine's front without the router.

Each is one warm-up rollout, then the median of --repeats timed ones. The router's cost per request is the median
latency of --latency-requests sequential requests through the router minus the median sent directly. The last line is
the batched / router samples-per-second ratio on each engine.

Usage: python bench/http_rollout.py [--prompts 16 --samples 8 --max-response-len 3 --repeats 5 --engines torch sglang]
"""

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import ray
from engines import rollout_shape_arguments  # bench/engines.py: this script's folder is first on sys.path

from miles.rollout.embedded import ensure_embedded_default
from miles.rollout.engine_actor import engine_actor_class
from miles.rollout.router import start_router
from miles.utils.async_utils import run
from miles.utils.http_utils import init_http_client, post


def engine_actor(name: str, checkpoint: str):
    """The engine's actor, as ``create_rollout_manager`` makes it (one CPU)."""
    if name == "torch":
        from miles.rollout.engine import TorchRolloutEngine as engine_class

        init_args = (checkpoint, 0, 1)
    else:
        from miles.rollout.sglang_engine import SGLangRolloutEngine as engine_class

        init_args = (checkpoint, 0, {}, 0, None, 600.0)
    return ray.remote(engine_actor_class(engine_class)).options(num_cpus=1).remote(engine_class, *init_args)


def median_s(rollout, repeats: int) -> float:
    rollout(0)  # warm-up
    times = []
    for seed in range(1, repeats + 1):
        start = time.perf_counter()
        rollout(seed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def http_rollout(url: str, prompt_ids: list[list[int]], samples: int, max_len: int, seed: int) -> None:
    """Every sample as its own request, all awaited together (a generate function's rollout)."""
    bodies = [{"input_ids": ids, "return_logprob": True,
               "sampling_params": {"temperature": 1.0, "max_new_tokens": max_len, "sampling_seed": seed * 10_000 + i}}
              for i, ids in enumerate(row for row in prompt_ids for _ in range(samples))]

    async def every():
        return await asyncio.gather(*(post(f"{url}/generate", body) for body in bodies))

    answers = run(every())
    assert len(answers) == len(bodies) and all(answer["meta_info"]["completion_tokens"] >= 1 for answer in answers)


def median_latency_ms(url: str, prompt: list[int], count: int) -> float:
    times = []
    with httpx.Client(timeout=60) as client:
        for i in range(count):
            start = time.perf_counter()
            client.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 1, "sampling_seed": i}}).raise_for_status()
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(name: str, checkpoint: str, prompts: list[dict], options) -> dict:
    from miles.models.hf import load_tokenizer

    actor = engine_actor(name, checkpoint)
    try:
        url = ray.get(actor.start_server.remote("truncated"))
        tokenizer = load_tokenizer(checkpoint)
        prompt_ids = [tokenizer(p["prompt"])["input_ids"] for p in prompts]
        with start_router([url], [], 60.0) as router:
            shape = (prompt_ids, options.samples, options.max_response_len)
            result = {
                "batched": median_s(lambda seed: ray.get(actor.generate.remote(
                    prompts, options.samples, 1.0, options.max_response_len, seed)), options.repeats),
                "router": median_s(lambda seed: http_rollout(router.url, *shape, seed), options.repeats),
                "direct": median_s(lambda seed: http_rollout(url, *shape, seed), options.repeats),
                "router_ms": median_latency_ms(router.url, prompt_ids[0], options.latency_requests),
                "direct_ms": median_latency_ms(url, prompt_ids[0], options.latency_requests),
            }
    finally:
        if hasattr(actor, "shutdown"):
            ray.get(actor.shutdown.remote())
        ray.kill(actor)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rollout_shape_arguments(parser)
    parser.add_argument("--latency-requests", type=int, default=200)
    parser.add_argument("--engines", nargs="+", default=["torch", "sglang"], choices=["torch", "sglang"])
    options = parser.parse_args()
    embedded = ensure_embedded_default()
    prompts = [json.loads(line) for line in Path(embedded.train_jsonl).read_text().splitlines()[: options.prompts]]
    total = options.prompts * options.samples
    init_http_client(SimpleNamespace(rollout_num_engines=1))  # a run's client for one engine
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        results = {name: measure(name, embedded.checkpoint_dir, prompts, options) for name in options.engines}
    finally:
        ray.shutdown()
    print(f"rollout: {options.prompts} prompts x {options.samples} samples, <= {options.max_response_len} tokens; "
          f"samples/s (median of {options.repeats})")
    print(f"{'engine':<8}{'batched':>10}{'router':>10}{'direct':>10}{'router ms/req':>15}{'direct ms/req':>15}")
    for name, r in results.items():
        print(f"{name:<8}{total / r['batched']:>10.0f}{total / r['router']:>10.0f}{total / r['direct']:>10.0f}"
              f"{r['router_ms']:>15.2f}{r['direct_ms']:>15.2f}")
    for name, r in results.items():
        print(f"{name}: batched/router samples/s {r['router'] / r['batched']:.2f}x; the router's cost per sequential "
              f"request {r['router_ms'] - r['direct_ms']:.2f} ms")


if __name__ == "__main__":
    main()
