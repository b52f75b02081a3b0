#!/usr/bin/env bash
# GRPO with upstream's custom generate function signature (examples/custom_generate/generate.py: top-k 8 for the
# training rollouts, the reward set while generating) and two evaluation datasets from an upstream-format
# --eval-config (examples/custom_generate/eval.yaml: metrics eval/addition and eval/addition_cold).
# Cost: 10 rollouts x 8 prompts x 4 samples on the embedded tiny model; each sample is its own engine request, so
# generation is slower than the batched default.
# Add flags after the script name; they are passed on ("$@").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python train.py \
    --advantage-estimator grpo \
    --num-rollout 10 \
    --rollout-batch-size 8 \
    --n-samples-per-prompt 4 \
    --custom-generate-function-path examples.custom_generate.generate.generate \
    --eval-config examples/custom_generate/eval.yaml \
    --eval-interval 5 \
    "$@"
