#!/usr/bin/env bash
# Async PPO with --keep-old-actor on the megatron backend: the actor and the critic are megatron-core GPTModels
# converted from the embedded Qwen2 checkpoint (docs/megatron.md); the rollout engines still receive Hugging Face
# weights, and the runtime guard checks the megatron denominator against the engine's log-probs every rollout.
# Needs the [megatron] extra (scripts/setup.sh installs it). On a machine without CUDA it runs on gloo with the
# backend's CPU shim.
# Cost: 20 rollouts x 16 prompts x 8 samples on the embedded tiny model; start-up adds megatron-core's import
# (about 10 s per train process).
# Add flags after the script name; they are passed on ("$@").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python train_async.py \
    --train-backend megatron \
    --advantage-estimator ppo \
    --keep-old-actor \
    --num-rollout 20 \
    --rollout-batch-size 16 \
    --n-samples-per-prompt 8 \
    --critic-lr 1e-3 \
    --eval-interval 10 \
    --seed 1 \
    "$@"
