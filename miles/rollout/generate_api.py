"""Upstream's generate API: the state a generate function reads and the helpers that turn a sample into a
``/generate`` request and an answer back into the sample (upstream's ``generate_endpoint_utils``), at upstream's
import paths through ``miles.rollout.sglang_rollout``, ``miles.rollout.base_types`` and
``miles.rollout.generate_hub.single_turn`` (docs/rollout.md).

Pure helpers around one HTTP call: ``request_payload`` (tokens, sampling params) -> the body, and
``update_sample_from_response`` (sample, body, answer) -> the sample filled as upstream fills it: its tokens, response,
rollout log-probs, weight version and status. The weight version it records is the engine's word for it; miles checks
every trained sample against what the engines themselves recorded serving (``miles.rollout.custom_generate``).
"""

from __future__ import annotations

from copy import deepcopy

from miles.utils.types import Sample


class GenerateState:
    """What a generate function reads besides ``args`` (upstream's ``GenerateState(args)``): ``tokenizer`` (the
    model's), ``processor`` (None: miles has no multimodal models), ``args``. One per checkpoint and process."""

    _by_checkpoint: dict[str, GenerateState] = {}

    def __new__(cls, args):
        state = cls._by_checkpoint.get(args.hf_checkpoint)
        if state is None:
            from miles.models.hf import load_tokenizer  # transformers: only in a process that generates by HTTP

            state = super().__new__(cls)
            state.tokenizer, state.processor = load_tokenizer(args.hf_checkpoint), None
            cls._by_checkpoint[args.hf_checkpoint] = state
        state.args = args
        return state

    def __init__(self, args) -> None:
        """Built in ``__new__`` (once per checkpoint)."""


def router_url(args, endpoint: str = "/generate") -> str:
    """The router's URL (``--sglang-router-ip``/``--sglang-router-port``, filled in by miles when it started one)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


def get_model_url(args, model_name: str = "", endpoint: str = "/generate") -> str:
    """Upstream's name for the router's URL (miles serves one model, so ``model_name`` picks nothing)."""
    return router_url(args, endpoint)


def compute_prompt_ids_from_sample(state: GenerateState, sample: Sample, tools=None) -> list[int]:
    """The prompt's token ids (a list of chat messages goes through the chat template first), as upstream."""
    prompt = sample.prompt
    if not isinstance(prompt, str):
        prompt = state.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, tools=tools)
    return state.tokenizer.encode(prompt, add_special_tokens=False)


def request_payload(input_ids: list[int], sampling_params: dict) -> dict:
    """The ``/generate`` body for ``input_ids`` (upstream's ``compute_request_payload`` without the features miles'
    engines lack): every sampling parameter passed as given, log-probs asked for."""
    return {"input_ids": list(input_ids), "sampling_params": deepcopy(sampling_params), "return_logprob": True}


async def update_sample_from_response(args, sample: Sample, payload: dict, output: dict,
                                      update_loss_mask: bool = False) -> Sample:
    """Upstream's: the answer's tokens, log-probs and text appended to ``sample``, its weight version and status
    recorded (``Sample.update_from_meta_info``); with ``update_loss_mask`` the new tokens get loss mask 1."""
    if not sample.response and not sample.tokens:
        sample.tokens = list(payload["input_ids"])
    entries = output["meta_info"].get("output_token_logprobs") or []
    new_tokens, new_log_probs = [int(entry[1]) for entry in entries], [float(entry[0]) for entry in entries]
    sample.tokens = sample.tokens + new_tokens
    sample.response_length += len(new_tokens)
    sample.response += output["text"]
    sample.rollout_log_probs = list(sample.rollout_log_probs or []) + new_log_probs
    if update_loss_mask:
        sample.loss_mask = list(sample.loss_mask or []) + [1] * len(new_tokens)
    sample.update_from_meta_info(args, output["meta_info"])
    return sample
