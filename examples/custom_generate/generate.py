"""An upstream-style custom generate function for the embedded addition task (docs/training.md, "A custom generate
function"): sample the training rollouts from each step's 8 likeliest tokens, and score each answer as it is
generated, the way an environment that rewards its own episodes does.

    --custom-generate-function-path examples.custom_generate.generate.generate

Upstream's signature and import path: miles awaits it once per sample and it awaits miles' ``generate``, which
asks the configured engine for one response and fills the sample with its tokens, log-probs and weight version.
"""

from miles.rollout.sglang_rollout import generate as generate_base


async def generate(args, sample, sampling_params, evaluation=False):
    params = dict(sampling_params)
    if not evaluation:  # evaluation keeps the launch's (or the eval config's) sampling
        params["top_k"] = 8
    sample = await generate_base(args, sample, params)
    sample.reward = 1.0 if sample.response.strip() == sample.label.strip() else 0.0
    return sample
