#!/usr/bin/env bash
# Async GRPO: critic-free, so the contract exempts it (upstream compatibility). Its data is just as stale as
# async PPO's (the same clipped ratio against the current actor); add --use-tis or --keep-old-actor to
# correct it anyway.
# Cost: 20 rollouts x 16 prompts x 8 samples (2,560 answers of at most 3 tokens) on the embedded tiny model,
# no critic.
# Measured on a 2-core CPU: 35-55 s in all, mostly starting Ray and the actors; the 20 rollouts train in 4-6 s.
# Add flags after the script name; they are passed on ("$@").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python train_async.py \
    --advantage-estimator grpo \
    --num-rollout 20 \
    --rollout-batch-size 16 \
    --n-samples-per-prompt 8 \
    --eval-interval 10 \
    --seed 1 \
    "$@"
