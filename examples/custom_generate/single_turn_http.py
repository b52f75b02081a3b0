"""An upstream-style single-turn generate function, written as upstream's examples write theirs (search-r1's
``generate_with_search.py`` without the search): the state's tokenizer, one POST to the router, the sample filled
from the answer's ``output_token_logprobs``, no weight-version bookkeeping of its own (docs/rollout.md).

    --custom-generate-function-path examples.custom_generate.single_turn_http.generate

miles checks each returned sample against what the engine that served it recorded, and sets its weight version and
fingerprint from that record.
"""

from miles.rollout.sglang_rollout import GenerateState
from miles.utils.http_utils import post
from miles.utils.types import Sample


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    output = await post(url, {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True})

    entries = output["meta_info"]["output_token_logprobs"]  # [logprob, token_id, text] per generated token
    sample.tokens = prompt_ids + [token for _, token, _ in entries]
    sample.response_length = len(entries)
    sample.response = output["text"]
    sample.rollout_log_probs = [log_prob for log_prob, _, _ in entries]
    sample.loss_mask = [1] * len(entries)
    match output["meta_info"]["finish_reason"]["type"]:
        case "length":
            sample.status = Sample.Status.TRUNCATED
        case "abort":
            sample.status = Sample.Status.ABORTED
        case _:
            sample.status = Sample.Status.COMPLETED
    return sample
