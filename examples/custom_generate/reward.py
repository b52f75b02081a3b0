"""An upstream-form reward function for the embedded addition task (docs/training.md, "Rewards"):

    --custom-rm-path examples.custom_generate.reward.reward_func

Upstream's signature and spelling (a dotted path, no colon): miles awaits it once per sample, all of a rollout's
calls together, with the run's ``args`` and the ``Sample``; ``sample.label`` is the dataset's value, so a label
stored as an object (``{"ground_truth": "7"}``, as upstream's Parquet examples store it) arrives as a dict.
"""


async def reward_func(args, sample, **kwargs) -> float:
    label = sample.label["ground_truth"] if isinstance(sample.label, dict) else str(sample.label)
    return 1.0 if sample.response.strip() == label.strip() else 0.0
