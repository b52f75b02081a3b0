"""Every flag upstream's public launchers pass (radixark/miles scripts/*.sh, scripts/models/*.sh and *.py,
examples/**/*.sh) is known to miles' parser: implemented, or refused with its reason. The names below were collected
from those launchers (names only, not their text); ``--sglang-*`` words are SGLang's and pass through, so they are
left out."""

import pytest

from miles.config.arguments import build_parser
from miles.config.departures import load_refusals
from miles.config.refused import implemented_actions

# scripts/run-qwen3-4B.sh (the reference launch) and the on-policy distillation examples
LAUNCHER_FLAGS = [
    "--actor-num-nodes", "--actor-num-gpus-per-node", "--colocate", "--hf-checkpoint", "--ref-load", "--load",
    "--save", "--save-interval", "--prompt-data", "--input-key", "--label-key", "--apply-chat-template",
    "--rollout-shuffle", "--rm-type", "--num-rollout", "--rollout-batch-size", "--n-samples-per-prompt",
    "--rollout-max-response-len", "--rollout-temperature", "--global-batch-size", "--balance-data",
    "--eval-interval", "--eval-prompt-data", "--n-samples-per-eval-prompt", "--eval-max-response-len",
    "--eval-top-p", "--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--use-dynamic-batch-size",
    "--max-tokens-per-gpu", "--advantage-estimator", "--use-kl-loss", "--kl-loss-coef", "--kl-loss-type",
    "--entropy-coef", "--eps-clip", "--eps-clip-high", "--optimizer", "--lr", "--lr-decay-style", "--weight-decay",
    "--adam-beta1", "--adam-beta2", "--rollout-num-gpus-per-engine", "--attention-dropout", "--hidden-dropout",
    "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32", "--attention-backend",
    "--use-opd", "--opd-type", "--opd-kl-coef", "--opd-teacher-load", "--opd-teacher-ckpt-step", "--opd-loss-coef",
    "--opd-kl-type", "--opd-token-selection", "--opd-teacher-timeout-s", "--opd-disable-rl-reward",
    "--teacher-hf-checkpoint", "--teacher-num-gpus-per-engine",
    "--use-rollout-logprobs", "--use-fault-tolerance", "--log-passrate", "--reward-key", "--rm-url",
    "--custom-reward-post-process-path", "--train-env-vars", "--train-memory-margin-bytes", "--log-probs-chunk-size",
    "--qkv-format", "--calculate-per-token-loss", "--use-rollout-routing-replay", "--lora-rank", "--lora-alpha",
    "--target-modules",
    # the flags issue 30 counted in upstream's public launchers at 31f1ca96, with scripts/models/*.sh's architecture
    "--rollout-num-gpus", "--num-gpus-per-node", "--eval-config", "--over-sampling-batch-size",
    "--dynamic-sampling-filter-path", "--custom-generate-function-path", "--megatron-to-hf-mode",
    "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
    "--num-query-groups", "--kv-channels", "--vocab-size", "--normalization", "--norm-epsilon", "--swiglu",
    "--rotary-base", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--qk-layernorm", "--position-embedding-type", "--rotary-percent", "--use-rotary-position-embeddings",
    # newer upstream launchers (checkpoint and DSA-indexer flags)
    "--warm-hf-checkpoint-page-cache", "--use-rollout-indexer-replay", "--use-indexer-replay",
    # the sweep of 126 public launchers (docs/conformance.md): newer upstream flags, and flags that an example's
    # own code defines (its driver's add_custom_arguments, a generate function's add_arguments)
    "--fully-async", "--filter-zero-reward-samples", "--eval-num-gpus", "--eval-num-gpus-per-engine",
    "--eval-hf-dir", "--eval-keep-snapshots", "--tb-dir", "--miles-router-enable-token-input-for-chat-completions",
    "--experts-shared-outer-loras", "--lora-base-cpu-backup", "--custom-agent-function-path",
    "--generate-multi-samples", "--agent-base-url", "--custom-reward-path", "--rlve", "--environment-list",
    "--custom-prompt-preprocessor", "--answer-marker-type", "--opd-teacher-key", "--opd-reward-weight-mode",
    "--opd-top-k-strategy", "--opd-teacher-adapters", "--opd-teacher-urls", "--opd-privileged-context-key",
    "--use-gated-attention", "--minimax-m3-vl", "--m2n-pp-concurrency", "--use-rs", "--tis-batch-normalize",
    "--tis-lower-bound", "--tis-upper-bound",
    # the sweep's second part (144 launchers, 41 models files): int4 rollout weights and DeepSeek-V4's architecture
    "--int4-params-rollout", "--dsv4-compress-ratios", "--dsv4-compress-rope-theta", "--dsv4-hc-mult",
    "--dsv4-hc-sinkhorn-iters", "--dsv4-n-hash-layers", "--dsv4-o-groups", "--dsv4-o-lora-rank", "--dsv4-window-size",
    "--beta-fast", "--beta-slow", "--original-max-position-embeddings", "--no-activation-func-clamp-shared-expert",
    # the Python models files (scripts/models/*.py, which model_args_utils.py prints as MODEL_ARGS): DeepSeek-V4.1
    "--num-residual-streams", "--mhc-sinkhorn-iterations", "--csa-compress-ratios", "--csa-compress-rotary-base",
    "--o-groups", "--o-lora-rank", "--moe-n-hash-layers", "--csa-window-size",
    # upstream's Python launchers (scripts/run_*.py, which build the command with command_utils): newer flags
    "--check-weight-update-skip-list", "--colocate-memory-peak-device", "--offload-train-target",
    "--offload-train-disk-dir", "--stream-optimizer-state-to-disk", "--rematerialize-param-from-master-weight",
    "--dsa-attention-backend", "--dsv4-impl", "--moe-router-freeze-gate", "--freeze-e-score-correction-bias",
    "--diffusion-noise-epsilon", "--diffusion-self-conditioning-probability", "--diffusion-encoder-loss-weight",
    "--diffusion-freeze-router", "--use-sglang", "--offload-train-disk-chunk-mb", "--opd-domain-balance",
    "--opd-domain-targets", "--opd-loss-mode", "--opd-reward-refresh", "--opd-topk-per-position",
    "--check-lora-weight-equal", "--debug-lora-train-only", "--check-weight-update-allow-quant-error",
    "--linear-attention-backend", "--stream-optimizer-state-moment-dtype",
    "--titan-model-name", "--titan-model-flavor", "--titan-seq-len", "--titan-tensor-parallel-degree",
    "--titan-pipeline-parallel-degree", "--titan-context-parallel-degree",
    "--inkling-attn-backend", "--inkling-freeze-global-scale", "--optimizer-state-nvme-dir",
    "--optimizer-state-nvme-chunk-mb", "--inkling-mm-towers", "--no-use-rollout-routing-replay",
    # the FSDP launchers (scripts/fsdp_rl/common.sh, scripts/run-qwen3-4B-fsdp.sh): upstream's FSDP backend's parser
    "--gradient-checkpointing", "--attn-implementation", "--fsdp-cpu-offload",
]


@pytest.mark.parametrize("flag", LAUNCHER_FLAGS)
def test_every_flag_the_public_launchers_use_is_implemented_or_refused(flag):
    implemented = {option for action in implemented_actions(build_parser()) for option in action.option_strings}
    assert flag in implemented or flag in load_refusals(), (
        f"{flag}: an upstream launcher passes it, but miles' parser neither implements nor refuses it; add it to "
        "miles/config/flags.py or to a [refused.\"group\"] row of miles/config/departures.toml")


def test_the_distillation_flags_are_refused_with_the_commit_they_were_seen_at():
    refusals = load_refusals()
    assert {refusals[flag].group for flag in ("--use-opd", "--opd-type", "--opd-kl-coef")} == {"on-policy distillation"}
    assert refusals["--use-opd"].nargs == 0 and refusals["--opd-type"].nargs is None  # upstream's arity
    assert refusals["--use-opd"].newer_upstream == "31f1ca96"
