#!/usr/bin/env bash
# Async PPO corrected with --keep-old-actor: the ratio denominator is recomputed with the exact weights the
# rollout engines used (a snapshot per pushed weight version), so PPO's clipping acts on pi_theta/pi_behavior.
# Weights are pushed every 2 rollouts here, where upstream's two-slot queue would leave every second rollout
# uncorrected; miles keys snapshots by version, so it stays exact.
# Cost: 20 rollouts x 16 prompts x 8 samples (2,560 answers of at most 3 tokens) on the embedded tiny model,
# one extra forward pass per rollout and at most two weight snapshots in memory.
# Measured on a 2-core CPU: 35-55 s in all, mostly starting Ray and the actors; the 20 rollouts train in 4-6 s.
# Add flags after the script name; they are passed on ("$@").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python train_async.py \
    --advantage-estimator ppo \
    --keep-old-actor \
    --update-weights-interval 2 \
    --num-rollout 20 \
    --rollout-batch-size 16 \
    --n-samples-per-prompt 8 \
    --critic-lr 1e-3 \
    --eval-interval 10 \
    --seed 1 \
    "$@"
