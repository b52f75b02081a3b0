"""An upstream-style multi-turn generate function (search-r1's shape, ``generate_with_search.py``): engine turns
through the router, a tool's output between them with loss mask 0 and log-prob 0.0, no weight-version bookkeeping of
its own (docs/rollout.md, "Multi-turn samples").

    --custom-generate-function-path examples.custom_generate.multi_turn_http.generate --tool-url URL

The tool is any HTTP server answering ``POST URL {"query": text}`` with ``{"result": text}``; its text must be in the
model's vocabulary (the embedded model's is digits, ``+`` and ``=``). miles checks every token with loss mask 1
against the engine that generated it, after exactly the tokens before it.
"""

from miles.rollout.generate_api import update_sample_from_response
from miles.rollout.sglang_rollout import GenerateState
from miles.utils.http_utils import post
from miles.utils.types import Sample


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    for turn in range(args.max_turns):
        payload = {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True}
        output = await post(url, payload)
        await update_sample_from_response(args, sample, payload, output, update_loss_mask=True)
        if turn == args.max_turns - 1:
            break
        observation = (await post(args.tool_url, {"query": output["text"]}))["result"]
        observation_ids = state.tokenizer.encode(observation, add_special_tokens=False)
        sample.tokens += observation_ids  # the tool's tokens: context for the next turn, never trained
        sample.response_length += len(observation_ids)
        sample.response += observation
        sample.loss_mask += [0] * len(observation_ids)
        sample.rollout_log_probs += [0.0] * len(observation_ids)
    return sample


def add_arguments(parser) -> None:
    parser.add_argument("--tool-url", required=True, help="The tool's HTTP endpoint (POST {query} -> {result}).")
    parser.add_argument("--max-turns", type=int, default=2, help="Engine turns per sample. (default: %(default)s)")


generate.add_arguments = add_arguments
