"""Upstream's default generate function (its import path): one ``/generate`` call through the router for the
sample's prompt; ``legacy_generate`` is the same call in upstream's legacy form.

    --custom-generate-function-path miles.rollout.generate_hub.single_turn.generate
"""

from __future__ import annotations

from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
from miles.rollout.generate_api import (
    GenerateState,
    compute_prompt_ids_from_sample,
    request_payload,
    router_url,
    update_sample_from_response,
)
from miles.utils.errors import MilesConfigError
from miles.utils.http_utils import post
from miles.utils.types import Sample


async def generate(input: GenerateFnInput) -> GenerateFnOutput:  # noqa: A002 - upstream's parameter name
    sample = input.sample
    if sample.response_length or sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise MilesConfigError(f"single_turn.generate got sample {sample.index} with a response already "
                               f"({sample.response_length} tokens, {sample.status.value}); continuing a response "
                               "(a partial rollout) is not implemented in miles yet.")
    payload = request_payload(compute_prompt_ids_from_sample(input.state, sample), input.sampling_params)
    output = await post(router_url(input.args), payload)
    await update_sample_from_response(input.args, sample, payload=payload, output=output)
    return GenerateFnOutput(samples=sample)


async def legacy_generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """Upstream's legacy form of the same call (``miles.rollout.sglang_rollout.generate``)."""
    output = await generate(GenerateFnInput(GenerateState(args), sample, sampling_params, evaluation))
    return output.samples
