#!/usr/bin/env bash
# A launch script shaped like upstream miles' scripts/run-*.sh: the same argument groups (MODEL_ARGS as
# scripts/models/*.sh pass them, CKPT, ROLLOUT, EVAL, PERF, PPO, OPTIMIZER, MISC) and upstream's flag names,
# with the paths pointed at the embedded default and the sizes cut to this CPU machine. Every flag below is one
# miles implements with upstream's meaning (docs/conformance.md lists the refused ones):
# - the architecture flags are checked against the checkpoint's config.json before Ray starts;
# - --rollout-num-gpus / --rollout-num-gpus-per-engine size the engines (a "GPU" is one engine process here);
# - recompute, dynamic batch size, --balance-data, dropout and DAPO dynamic sampling train as upstream;
# - a custom generate function (upstream's signature) produces the samples, and --eval-config names the eval sets.
# Cost: about 40 s on a 2-core CPU for the 4 rollouts, mostly starting Ray and megatron-core.
# TRAIN_BACKEND=torch runs the same launch on the torch backend. Add flags after the script name ("$@").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The embedded tiny Qwen2, as upstream's scripts/models/qwen2.5-*.sh describe theirs.
MODEL_ARGS=(
    --swiglu --num-layers 2 --hidden-size 64 --ffn-hidden-size 256
    --num-attention-heads 4 --group-query-attention --num-query-groups 4 --kv-channels 16
    --use-rotary-position-embeddings --position-embedding-type rope --rotary-base 10000
    --disable-bias-linear --add-qkv-bias --normalization RMSNorm --norm-epsilon 1e-6 --vocab-size 15
)
CKPT_ARGS=()  # upstream: --hf-checkpoint /root/Qwen2.5-... --ref-load ...; here the embedded default
ROLLOUT_ARGS=(
    --apply-chat-template --rollout-shuffle
    --num-rollout 4 --rollout-batch-size 8 --n-samples-per-prompt 4
    --rollout-max-response-len 3 --rollout-temperature 1.0
    --over-sampling-batch-size 12
    --dynamic-sampling-filter-path miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std
    --global-batch-size 32 --balance-data
)
EVAL_ARGS=(--eval-interval 2 --eval-config examples/custom_generate/eval.yaml)
PLUGIN_ARGS=(--custom-generate-function-path examples.custom_generate.generate.generate)
PERF_ARGS=(
    --tensor-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 1
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
    --use-dynamic-batch-size --max-tokens-per-gpu 64
)
PPO_ARGS=(--advantage-estimator ppo --keep-old-actor --eps-clip 0.2 --eps-clip-high 0.28 --critic-lr 1e-3)
OPTIMIZER_ARGS=(--optimizer adam --lr 1e-3 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98)
MISC_ARGS=(
    --attention-dropout 0.0 --hidden-dropout 0.0
    --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32 --attention-backend local
    --actor-num-nodes 1 --actor-num-gpus-per-node 1
    --rollout-num-gpus 2 --rollout-num-gpus-per-engine 1 --seed 1
)

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python train_async.py \
    --train-backend "${TRAIN_BACKEND:-megatron}" \
    "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" "${PERF_ARGS[@]}" \
    "${PLUGIN_ARGS[@]}" "${PPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${MISC_ARGS[@]}" \
    "$@"
