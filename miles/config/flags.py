"""miles' command-line flags, one function per topic group.

Flag names follow upstream miles (kebab-case on the command line, snake_case on ``args``). Every flag has a
default, and the defaults train the embedded default (a tiny model on digit addition, see
``docs/embedded_default.md``) on a CPU, so ``python train_async.py`` alone runs. Where a default departs from
upstream, it is listed in ``miles/config/departures.toml`` (rendered into ``--help`` and the docs, and checked
against upstream's own parser: docs/conformance.md).

Validation and derived values live in ``miles/config/arguments.py``; this module only declares flags, so it
imports nothing heavy. The correction flags come from the corrections table (``miles/config/corrections.py``).
"""

import argparse
import json

from miles.config import corrections, refused

TRAIN_BACKENDS = ("torch", "megatron")  # miles.backends loads each
ROLLOUT_BACKENDS = ("torch", "sglang")  # miles.rollout.protocol.ENGINES starts each

def add_algorithm_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("algorithm")
    group.add_argument(
        "--advantage-estimator",
        choices=["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"],
        default="grpo",
        help="Advantage estimator. 'ppo' trains a critic (GAE); the others are critic-free. (default: %(default)s)",
    )
    group.add_argument("--eps-clip", type=float, default=0.2, help="PPO clip range, low side. (default: %(default)s)")
    group.add_argument("--eps-clip-high", type=float, default=None, help="PPO clip range, high side. (default: --eps-clip)")
    group.add_argument(
        "--eps-clip-c", type=float, default=None, help="Dual-clip constant c > 1 for negative advantages. (default: off)"
    )
    group.add_argument("--value-clip", type=float, default=0.2, help="Critic value clip range. (default: %(default)s)")
    group.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="KL penalty folded into the reward (REINFORCE++ style); must be 0 for PPO. (default: %(default)s)",
    )
    group.add_argument("--use-kl-loss", action="store_true", help="Add a KL(pi || ref) term to the policy loss.")
    group.add_argument("--kl-loss-coef", type=float, default=0.0, help="Coefficient of the KL loss. (default: %(default)s)")
    group.add_argument(
        "--kl-loss-type",
        choices=["k1", "k2", "k3", "low_var_kl"],
        default="k1",
        help="KL estimator of the KL loss. (default: %(default)s)",
    )
    group.add_argument(
        "--use-unbiased-kl", action="store_true", help="Weight the KL loss by the importance ratio pi/pi_old."
    )
    group.add_argument("--entropy-coef", type=float, default=0.0, help="Entropy bonus coefficient. (default: %(default)s)")
    group.add_argument("--gamma", type=float, default=1.0, help="Discount factor. (default: %(default)s)")
    group.add_argument("--lambd", type=float, default=1.0, help="GAE lambda. (default: %(default)s)")
    group.add_argument(
        "--normalize-advantages",
        action="store_true",
        help="Whiten advantages over the rollout (required by both REINFORCE++ estimators).",
    )
    group.add_argument(
        "--disable-grpo-std-normalization",
        action="store_false",
        dest="grpo_std_normalization",
        help="GRPO/GSPO: subtract the group mean only, do not divide by the group std (upstream's dest: "
        "args.grpo_std_normalization, True unless this flag is given).",
    )
    group.add_argument(
        "--num-critic-only-steps",
        type=int,
        default=0,
        help="PPO: train only the critic for the first N rollouts. (default: %(default)s)",
    )
    group.add_argument(
        "--calculate-per-token-loss",
        action="store_true",
        help="Average the loss over tokens of the whole step instead of per-sample means.",
    )
    group.add_argument(
        "--ref-load", default=None, help="Reference model folder for the KL terms. (default: --hf-checkpoint)"
    )


def add_off_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The behavior-policy corrections (docs/async_off_policy_contract.md) and the runtime guard's bounds."""
    group = parser.add_argument_group("off-policy correction and runtime guard")
    for row in corrections.CORRECTIONS:
        group.add_argument(row.flag, action="store_true",
                           help=f"Behavior-policy correction: {row.does}{row.help_tail}")
    group.add_argument("--tis-clip", type=float, default=2.0, help="Upper bound of the TIS weight. (default: %(default)s)")
    group.add_argument("--tis-clip-low", type=float, default=0.0, help="Lower bound of the TIS weight. (default: %(default)s)")
    group.add_argument(
        "--get-mismatch-metrics",
        action="store_true",
        help="Report the TIS weight metrics (tis, tis_clipfrac, tis_abs, ois) without applying TIS.",
    )
    group.add_argument(
        "--keep-old-actor-tol",
        type=float,
        default=1e-4,
        help="Runtime guard: largest allowed |old - rollout| log-prob per token under --keep-old-actor (tight for "
        "the torch engine in fp32, which agrees to ~1e-6; raise it for engines that are not bit-compatible). "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--max-weight-staleness",
        type=int,
        default=None,
        help="Reject a launch (and stop a run) whose data is more than K rollouts stale. Counts rollouts trained "
        "between generation and training, unlike upstream's fully-async sample filter. (default: off)",
    )
    group.add_argument(
        "--max-behavior-kl",
        type=float,
        default=None,
        help="Stop the run (after saving) when KL(behavior || current policy) at the first optimizer step of a "
        "rollout exceeds this. (default: off)",
    )



def add_tis_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """How --use-tis weights or masks the loss, upstream's TIS hook, and OPSM (docs/corrections.md)."""
    group = parser.add_argument_group(
        "TIS variants and sequence masking",
        "Every TIS variant acts only under --use-tis, and so counts as the --use-tis correction; --use-opsm is "
        "not a behavior-policy correction.",
    )
    group.add_argument(
        "--tis-mode",
        choices=corrections.TIS_MODES,
        default="clip",
        help="How --use-tis bounds the ratio r: truncate w = min(r, --tis-clip); clip w = clamp(r, --tis-clip-low, "
        "--tis-clip) (upstream's vanilla TIS); mask: tokens with r outside [--tis-clip-low, --tis-clip] leave the "
        "loss (IcePop). Needs --use-tis. Formulas: docs/corrections.md. (default: %(default)s)",
    )
    group.add_argument(
        "--tis-level",
        choices=corrections.TIS_LEVELS,
        default="token",
        help="Where --use-tis takes the ratio: per token r = exp(old - roll); per sequence r = exp(sum of the token "
        "log ratios); geometric r = exp(their mean). Needs --use-tis. (default: %(default)s)",
    )
    group.add_argument(
        "--rs-level",
        choices=corrections.TIS_LEVELS,
        default=None,
        help="Rejection sampling under --use-tis: drop the tokens whose ratio at this level lies outside "
        "[--rs-lower-bound, --rs-upper-bound] (e.g. geometric with bounds 0.99 and 1.01: SkyRL's geometric "
        "sequence masking). (default: off)",
    )
    group.add_argument("--rs-lower-bound", type=float, default=None,
                       help="Lower bound of --rs-level's ratio. (default: --tis-clip-low)")
    group.add_argument("--rs-upper-bound", type=float, default=None,
                       help="Upper bound of --rs-level's ratio. (default: --tis-clip)")
    group.add_argument(
        "--rs-veto-threshold",
        type=float,
        default=None,
        help="Veto under --use-tis: drop every token of a sequence holding a token whose ratio exp(old - roll) is "
        "below this (e.g. 1e-4). (default: off)",
    )
    group.add_argument(
        "--custom-tis-function-path",
        default=None,
        help="Dotted path of a TIS function with upstream's signature fn(args, *, pg_loss, train_log_probs, "
        "rollout_log_probs, loss_masks, **kwargs) -> (pg_loss, loss_masks, metrics), applied under --use-tis "
        "instead of --tis-mode/--tis-level/--rs-*; built-ins: "
        "miles.backends.training_utils.loss_hub.corrections.vanilla_tis_function and .icepop_function. "
        "(default: the built-in of --tis-mode and --tis-level)",
    )
    group.add_argument(
        "--custom-config-path",
        type=str,
        default=None,
        help="YAML file of extra settings for custom functions (e.g. a --custom-tis-function-path hook's "
        "tis_batch_normalize): each key becomes an attribute of args. A key naming a miles flag must agree with "
        "the command line, except the built-in TIS's own settings (--tis-mode, --tis-level, --rs-*) when "
        "--custom-tis-function-path replaces it. (default: none)",
    )
    group.add_argument(
        "--use-opsm",
        action="store_true",
        help="Off-Policy Sequence Masking (DeepSeek-V3.2): drop the negative-advantage tokens of a sequence whose "
        "mean (old - current) log-prob exceeds --opsm-delta. Not a behavior-policy correction for async PPO: its "
        "'old' is the ratio's denominator, the current actor's unless a correction changes it.",
    )
    group.add_argument("--opsm-delta", type=float, default=1e-4,
                       help="OPSM's threshold on a sequence's mean (old - current) log-prob. (default: %(default)s)")


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training loop")
    group.add_argument("--num-rollout", type=int, default=300, help="Number of rollouts to train on. (default: %(default)s)")
    group.add_argument(
        "--num-epoch",
        type=int,
        default=None,
        help="Train for this many passes over the prompt data instead of --num-rollout. (default: off)",
    )
    group.add_argument("--rollout-batch-size", type=int, default=16, help="Prompts per rollout. (default: %(default)s)")
    group.add_argument(
        "--n-samples-per-prompt", type=int, default=8, help="Responses sampled per prompt. (default: %(default)s)"
    )
    group.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="Samples per optimizer step. (default: rollout-batch-size * n-samples-per-prompt / num-steps-per-rollout)",
    )
    group.add_argument(
        "--num-steps-per-rollout", type=int, default=None, help="Optimizer steps per rollout. (default: 1)"
    )
    group.add_argument(
        "--micro-batch-size",
        type=int,
        default=128,
        help="Samples per forward/backward pass; gradients accumulate to the global batch. (default: %(default)s)",
    )
    group.add_argument(
        "--update-weights-interval",
        type=int,
        default=1,
        help="Async: push weights to the rollout engines every N rollouts. (default: %(default)s)",
    )
    group.add_argument(
        "--colocate", action="store_true", help="Sync only: put the rollout engines in the actor's placement bundle."
    )
    group.add_argument(
        "--start-rollout-id", type=int, default=None, help="First rollout id. (default: 0, or from --load)"
    )
    group.add_argument(
        "--debug-exit-after-rollout",
        type=int,
        default=None,
        help="Stop cleanly after training this rollout id (for debugging). (default: off)",
    )
    group.add_argument("--seed", type=int, default=1234, help="Training seed. (default: %(default)s)")
    group.add_argument(
        "--lr", type=float, default=3e-4,
        help="Actor learning rate: the schedule's peak (see --lr-decay-style). (default: %(default)s)",
    )
    group.add_argument("--critic-lr", type=float, default=None, help="Critic learning rate (peak). (default: --lr)")
    group.add_argument("--clip-grad", type=float, default=1.0, help="Gradient-norm clip. (default: %(default)s)")


def add_optimizer_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron's optimizer and learning-rate schedule flags, with Megatron's defaults (docs/training.md)."""
    group = parser.add_argument_group(
        "optimizer and learning-rate schedule",
        "An iteration is one optimizer step, counted over the whole run (across rollouts and resumes); the run has "
        "--num-rollout x --num-steps-per-rollout of them. The critic follows the same schedule with --critic-lr "
        "and --critic-lr-warmup-iters.",
    )
    group.add_argument(
        "--optimizer", choices=["adam", "sgd"], default="adam",
        help="'adam': Adam with decoupled weight decay (AdamW, as Megatron's); 'sgd': SGD with momentum and L2 "
        "weight decay. Biases and 1-D parameters get no weight decay. (default: %(default)s)",
    )
    group.add_argument("--weight-decay", type=float, default=0.01, help="Weight decay coefficient. (default: %(default)s)")
    group.add_argument("--adam-beta1", type=float, default=0.9, help="Adam's beta1. (default: %(default)s)")
    group.add_argument("--adam-beta2", type=float, default=0.999, help="Adam's beta2. (default: %(default)s)")
    group.add_argument("--adam-eps", type=float, default=1e-8, help="Adam's epsilon. (default: %(default)s)")
    group.add_argument("--sgd-momentum", type=float, default=0.9, help="SGD momentum. (default: %(default)s)")
    group.add_argument(
        "--lr-decay-style", choices=["constant", "linear", "cosine", "inverse-square-root"], default="constant",
        help="Decay of the learning rate after the warm-up, from --lr to --min-lr over --lr-decay-iters. "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--lr-decay-iters", type=int, default=None,
        help="Iterations to decay over. (default: the run's, --num-rollout x --num-steps-per-rollout)",
    )
    group.add_argument(
        "--lr-warmup-iters", type=int, default=0,
        help="Iterations of linear warm-up from --lr-warmup-init to --lr. (default: %(default)s)",
    )
    group.add_argument(
        "--lr-warmup-fraction", type=float, default=None,
        help="Warm-up as a fraction of --lr-decay-iters, instead of --lr-warmup-iters. (default: off)",
    )
    group.add_argument("--lr-warmup-init", type=float, default=0.0, help="Learning rate the warm-up starts from. (default: %(default)s)")
    group.add_argument("--min-lr", type=float, default=0.0, help="Learning rate the decay ends at. (default: %(default)s)")
    group.add_argument(
        "--critic-lr-warmup-iters", type=int, default=0,
        help="Iterations of the critic's linear warm-up. (default: %(default)s)",
    )


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training backend")
    group.add_argument(
        "--train-backend",
        choices=TRAIN_BACKENDS,
        default="megatron",
        help="Trainer of the actor and critic: 'megatron' (megatron-core's GPTModel converted from the Hugging Face "
        "checkpoint, as upstream; Qwen2-family models; needs the [megatron] extra, which scripts/setup.sh installs, "
        "docs/megatron.md) or 'torch' (the Hugging Face model as it is: any causal LM megatron cannot convert). "
        "Both take the same steps. (default: %(default)s)",
    )


def add_dropout_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dropout")
    group.add_argument("--attention-dropout", type=float, default=0.0,
                       help="Dropout of the attention probabilities while training (--train-backend torch: the "
                       "model's config field, e.g. attention_dropout; the rollout and the log-prob passes run "
                       "without). (default: %(default)s)")
    group.add_argument("--hidden-dropout", type=float, default=0.0,
                       help="Dropout of the hidden states while training (--train-backend torch, for models whose "
                       "config has one, e.g. hidden_dropout or resid_pdrop; Qwen2 and Llama have none). "
                       "(default: %(default)s)")


def add_recompute_arguments(parser: argparse.ArgumentParser) -> None:
    """Activation recompute: Megatron's flags and meanings, on both backends (docs/training.md#activation-recompute)."""
    group = parser.add_argument_group("activation recompute")
    group.add_argument("--recompute-granularity", choices=("full", "selective"), default=None,
                       help="Recompute activations in the backward pass instead of keeping them: 'full' recomputes "
                       "whole transformer layers (needs --recompute-method and --recompute-num-layers), "
                       "'selective' only --recompute-modules (megatron backend). The loss and the gradients are "
                       "the same; the memory of the saved activations shrinks. (default: %(default)s: keep them)")
    group.add_argument("--recompute-method", choices=("uniform", "block"), default=None,
                       help="With --recompute-granularity full: 'uniform' recomputes every layer, in chunks of "
                       "--recompute-num-layers layers (the torch backend: chunks of 1); 'block' recomputes the first "
                       "--recompute-num-layers layers and keeps the rest. (default: %(default)s)")
    group.add_argument("--recompute-num-layers", type=int, default=None,
                       help="With --recompute-granularity full: the layers per chunk (uniform) or the layers "
                       "recomputed (block), 1 to the model's layer count. (default: %(default)s)")
    group.add_argument("--recompute-modules", nargs="+", type=str, default=None,
                       help="With --recompute-granularity selective (megatron backend): the parts of each layer "
                       "recomputed: core_attn and/or mlp (Megatron's MoE and MLA modules do not exist in a Qwen2 "
                       "layer; its layernorm needs Transformer Engine). (default: %(default)s: Megatron's core_attn)")


def add_batching_arguments(parser: argparse.ArgumentParser) -> None:
    """How a step's samples are cut into forward passes and shared over DP ranks (docs/training.md#dynamic-batching)."""
    group = parser.add_argument_group("dynamic batching and data balance")
    group.add_argument("--use-dynamic-batch-size", action="store_true", default=False,
                       help="Cut each rank's share of a step into micro-batches by token budget "
                       "(--max-tokens-per-gpu) instead of --micro-batch-size, which is then ignored for training. "
                       "The step's samples and its gradient are the same, to float rounding.")
    group.add_argument("--max-tokens-per-gpu", type=int, default=None,
                       help="The token budget of one training micro-batch with --use-dynamic-batch-size, counted as "
                       "the forward pass sees it: samples x the longest one (miles right-pads); a longer sample is "
                       "a micro-batch of its own. (default: %(default)s)")
    group.add_argument("--log-probs-max-tokens-per-gpu", type=int, default=None,
                       help="The same budget for the no-grad passes (old and reference log-probs, the critic's old "
                       "values) with --use-dynamic-batch-size. (default: --max-tokens-per-gpu)")
    group.add_argument("--balance-data", action="store_true", default=False,
                       help="Share each optimizer step's samples over the data-parallel ranks so that each gets a "
                       "similar number of tokens (equal sample counts); the step's gradient is the same.")
    group.add_argument("--log-probs-chunk-size", type=int, default=-1,
                       help="Compute the log-softmax of a response this many tokens at a time, to bound the (tokens x "
                       "vocabulary) intermediate; the log-probs are the same to float rounding. -1 or 0: the whole "
                       "response at once. (default: %(default)s)")
    group.add_argument("--deterministic-mode", action="store_true",
                       help="Make each train process use only deterministic torch algorithms "
                       "(torch.use_deterministic_algorithms), so two runs of the same launch give the same metrics.")


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """How many ranks train each role and how they split the model (docs/ranks.md)."""
    group = parser.add_argument_group(
        "train ranks",
        "Each train role is a group of ranks, one Ray actor each: world size = nodes x GPUs per node, data-parallel "
        "size = world / tensor-parallel size. On a machine without GPUs a 'GPU' counts one train process with one "
        "CPU bundle.",
    )
    group.add_argument("--actor-num-nodes", type=int, default=1, help="Nodes the actor's ranks span. (default: %(default)s)")
    group.add_argument(
        "--qkv-format",
        type=str,
        choices=["thd", "bshd"],
        default="thd",
        help="Upstream's sequence layout (thd: packed, bshd: padded), read by context-parallel code such as "
        "upstream's TIS hooks; with miles' context-parallel size of 1 both give the same per-sample tensors. "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--actor-num-gpus-per-node",
        type=int,
        default=1,
        help="Actor ranks per node (a GPU each; without GPUs, a train process with one CPU bundle). (default: %(default)s)",
    )
    group.add_argument("--critic-num-nodes", type=int, default=None, help="Nodes of the critic (PPO). (default: --actor-num-nodes)")
    group.add_argument(
        "--critic-num-gpus-per-node", type=int, default=None, help="Critic ranks per node. (default: --actor-num-gpus-per-node)"
    )
    group.add_argument(
        "--tensor-model-parallel-size",
        type=int,
        default=1,
        help="Ranks that split each layer of a role's model (--train-backend megatron only). (default: %(default)s)",
    )
    group.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="With --tensor-model-parallel-size > 1, also split the activations outside attention and the MLP (norms, "
        "dropout) along the sequence over the tensor-parallel ranks (Megatron's sequence parallelism): less activation "
        "memory, the same loss and gradients. At size 1 there is nothing to split, and it changes nothing. "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--pipeline-model-parallel-size", type=int, default=1, help="Not implemented: only 1 is accepted. (default: %(default)s)"
    )


def add_architecture_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron's model-architecture flags, with upstream's names and defaults (miles/config/architecture.py)."""
    group = parser.add_argument_group(
        "model architecture (checked against --hf-checkpoint)",
        "miles builds the model from --hf-checkpoint's config.json; each of these flags given on the command line "
        "(as upstream's scripts/models/*.sh pass them) must agree with it, checked before Ray starts.",
    )
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
                 "--vocab-size"):
        group.add_argument(flag, type=int, default=None, help=argparse.SUPPRESS if flag != "--num-layers" else
                           "--num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads, --kv-channels, "
                           "--vocab-size: checked against config.json.")
    group.add_argument("--group-query-attention", action="store_true",
                       help="With --num-query-groups N: N key-value heads (config.json's num_key_value_heads).")
    group.add_argument("--num-query-groups", type=int, default=1, help=argparse.SUPPRESS)
    group.add_argument("--normalization", type=str, choices=["LayerNorm", "RMSNorm"], default="LayerNorm",
                       help="Checked against config.json (RMSNorm when it has rms_norm_eps). (default: %(default)s)")
    group.add_argument("--norm-epsilon", dest="layernorm_epsilon", type=float, default=1e-5,
                       help="Checked against rms_norm_eps (or layer_norm_eps). (default: %(default)s)")
    group.add_argument("--position-embedding-type", type=str, default="learned_absolute",
                       choices=["learned_absolute", "rope", "mrope", "relative", "none"],
                       help="Checked against config.json (rope when it has rope_theta). (default: %(default)s)")
    group.add_argument("--rotary-base", type=int, default=10000, help="Checked against rope_theta. (default: %(default)s)")
    group.add_argument("--rotary-percent", type=float, default=1.0,
                       help="Checked against partial_rotary_factor. (default: %(default)s)")
    for flag in ("--swiglu", "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights",
                 "--add-qkv-bias", "--qk-layernorm"):
        group.add_argument(flag, action="store_true", help=argparse.SUPPRESS if flag != "--swiglu" else
                           "--swiglu, --use-rotary-position-embeddings, --untie-embeddings-and-output-weights, "
                           "--add-qkv-bias, --qk-layernorm, --disable-bias-linear: each checked against the "
                           "checkpoint (hidden_act, rope_theta, tie_word_embeddings, its .bias and q_norm tensors).")
    group.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear", help=argparse.SUPPRESS)


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rollout and data")
    group.add_argument(
        "--hf-checkpoint",
        default=None,
        help="Local Hugging Face causal-LM folder to start from. (default: the embedded tiny model, built once "
        "and cached under $MILES_CACHE_DIR or ~/.cache/miles)",
    )
    group.add_argument(
        "--prompt-data", default=None,
        help="Prompt file: JSONL, or Parquet (*.parquet), one record per prompt with --input-key and --label-key; a "
        "label keeps its value (an object stays a dict). (default: the embedded task's train split)"
    )
    group.add_argument(
        "--eval-prompt-data", nargs="+", default=None,
        help="Held-out JSONL prompt files as NAME PATH pairs, metrics eval/NAME (one PATH alone is named aime, as "
             "upstream names it). (default: the embedded task's eval split, named addition)",
    )
    group.add_argument(
        "--eval-config", default=None,
        help="YAML file of evaluation datasets in upstream's format (eval: datasets: [{name, path, ...}], "
             "defaults); overrides --eval-prompt-data (docs/training.md, Evaluation datasets). (default: none)",
    )
    group.add_argument("--input-key", default="prompt", help="JSONL key of the prompt. (default: %(default)s)")
    group.add_argument("--eval-input-key", type=str, default=None,
                       help="The evaluation datasets' prompt key, where a dataset (or --eval-config's defaults) names "
                       "none. (default: --input-key)")
    group.add_argument("--eval-label-key", type=str, default=None,
                       help="The evaluation datasets' label key, likewise. (default: --label-key)")
    group.add_argument(
        "--apply-chat-template", action="store_true",
        help="Render each prompt as one user message through the tokenizer's chat template (with the generation "
        "prompt) before tokenizing it, as upstream. The embedded default's tokenizer has a small template of its own.",
    )
    group.add_argument(
        "--apply-chat-template-kwargs", type=json.loads, default="{}",
        help="JSON object of extra chat-template variables, e.g. '{\"enable_thinking\": false}'. (default: %(default)s)",
    )
    group.add_argument("--label-key", default="label", help="JSONL key of the label. (default: %(default)s)")
    group.add_argument("--rollout-temperature", type=float, default=1.0, help="Sampling temperature. (default: %(default)s)")
    group.add_argument(
        "--rollout-max-response-len", type=int, default=3, help="Most new tokens per response. (default: %(default)s)"
    )
    group.add_argument("--rollout-seed", type=int, default=42, help="Seed of rollout sampling. (default: %(default)s)")
    group.add_argument("--rollout-shuffle", action="store_true", help="Shuffle the prompt data each epoch.")
    # Upstream sizes the rollout in GPUs; without GPUs a "GPU" is one engine process with one CPU bundle (docs/training.md).
    group.add_argument(
        "--rollout-num-gpus", type=int, default=None,
        help="GPUs of the rollout engines: engines = --rollout-num-gpus / --rollout-num-gpus-per-engine (upstream's "
        "sizing; without GPUs a 'GPU' is one engine process with one CPU bundle). "
        "(default: --rollout-num-engines x --rollout-num-gpus-per-engine)",
    )
    group.add_argument(
        "--rollout-num-gpus-per-engine", type=int, default=1,
        help="GPUs per engine (SGLang's tensor-parallel size). Only 1: every miles engine is one process; "
        "tensor-parallel engines are not implemented. (default: %(default)s)",
    )
    group.add_argument(
        "--num-gpus-per-node", type=int, default=8,
        help="GPUs of one node for the rollout engines: an engine of more GPUs than this spans nodes (upstream's "
        "placement); with one-process engines none does. (default: %(default)s)",
    )
    group.add_argument(
        "--rollout-num-engines", type=int, default=None,
        help="Rollout engines, one CPU bundle each: another name for --rollout-num-gpus / "
        "--rollout-num-gpus-per-engine; giving both, they must agree. (default: that quotient, or 1)",
    )
    group.add_argument(
        "--rollout-backend",
        choices=ROLLOUT_BACKENDS,
        default="torch",
        help="Rollout engine: 'torch' (miles' own sampler on the trainer's model code) or 'sglang' (SGLang's offline "
        "engine in a Ray actor; needs the [sglang] extra, `bash scripts/setup.sh --with-sglang`, docs/sglang.md). "
        "SGLang's server arguments pass through as --sglang-NAME VALUE (checked against SGLang's own parser before "
        "Ray starts). (default: %(default)s)",
    )
    group.add_argument(
        "--rollout-engine-start-timeout",
        type=float,
        default=600.0,
        help="Seconds each SGLang engine may take to start before the run fails naming it. (default: %(default)s)",
    )
    group.add_argument(
        "--n-samples-per-eval-prompt", type=int, default=None,
        help="Responses sampled per held-out prompt. (default: --n-samples-per-prompt)",
    )
    group.add_argument(
        "--eval-temperature", type=float, default=None, help="Sampling temperature of evaluation. (default: --rollout-temperature)"
    )
    group.add_argument(
        "--eval-max-response-len", type=int, default=None,
        help="Most new tokens per evaluation response. (default: --rollout-max-response-len)",
    )
    # Truncated sampling and stops (docs/sampling.md): the behavior log-prob is that of the distribution sampled.
    group.add_argument("--rollout-top-p", type=float, default=1.0,
                       help="Top-p (nucleus) sampling threshold during rollout; 1.0 keeps every token. (default: %(default)s)")
    group.add_argument("--rollout-top-k", type=int, default=-1,
                       help="Top-k sampling threshold during rollout; -1 (or 0) means disabled. (default: %(default)s)")
    group.add_argument("--rollout-min-p", type=float, default=0.0,
                       help="Min-p sampling threshold during rollout (keep p >= min_p * max p); 0 means disabled. "
                       "(default: %(default)s)")
    group.add_argument("--rollout-stop", type=str, nargs="+", default=None,
                       help="Stop strings: a response ends (COMPLETED) with the token that completes one. (default: none)")
    group.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None,
                       help="Stop token ids, besides every eos id of the model. (default: none)")
    group.add_argument("--sampling-logprobs", choices=("truncated", "full"), default="truncated",
                       help="Behavior log-probs under top-p/top-k/min-p: 'truncated' = of the renormalized distribution "
                       "the token was drawn from, and the trainer recomputes under the same kept set (exact); 'full' = "
                       "of the whole softmax, upstream's behavior, biased (the ratio misses the kept mass). "
                       "(default: %(default)s)")
    group.add_argument("--eval-top-p", type=float, default=None,
                       help="Top-p of evaluation sampling. (default: --rollout-top-p)")
    group.add_argument("--eval-top-k", type=int, default=None,
                       help="Top-k of evaluation sampling. (default: --rollout-top-k)")
    group.add_argument("--save-debug-rollout-data", type=str, default=None,
                       help="Save each rollout's samples (Sample.to_dict(): tokens, response_length, rollout_log_probs, "
                       "weight_versions, status, ...) with torch.save to this path; '{rollout_id}' in it is replaced "
                       "by the rollout id. (default: off)")
    group.add_argument("--rm-type", default="math_exact", help="Built-in rule reward. (default: %(default)s)")
    group.add_argument(
        "--custom-rm-path",
        default=None,
        help="User reward function. Upstream's 'package.module.func': async def func(args, sample, **kwargs) -> float, "
        "awaited, sample.label the dataset's value (an object stays a dict); or miles' 'path/to/file.py:func' or "
        "'package.module:func' (a colon): func(prompt, response, label) -> float, label as text. Overrides --rm-type.",
    )
    group.add_argument(
        "--custom-generate-function-path",
        default=None,
        help="Upstream's per-sample generate function 'module.function': async def f(args, sample, sampling_params), "
        "which awaits miles.rollout.sglang_rollout.generate (docs/training.md, A custom generate function). "
        "(default: the engines' batched sampling)",
    )
    group.add_argument(
        "--over-sampling-batch-size",
        type=int,
        default=None,
        help="Prompts drawn per round of dynamic sampling: rounds are drawn until --rollout-batch-size groups pass "
        "--dynamic-sampling-filter-path; kept groups beyond it are dropped. At least --rollout-batch-size. "
        "(default: --rollout-batch-size)",
    )
    group.add_argument(
        "--dynamic-sampling-filter-path",
        default=None,
        help="Filter of each group, 'package.module.function' called as fn(args, samples) -> "
        "DynamicFilterOutput(keep, reason) (miles.rollout.filter_hub.base_types), e.g. DAPO's "
        "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std. (default: keep every group)",
    )


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The router in front of the engines' HTTP servers, upstream's flags (docs/rollout.md)."""
    group = parser.add_argument_group("router and HTTP")
    group.add_argument("--sglang-router-ip", type=str, default=None,
                       help="Address of a running sglang-router to register the engines with. (default: miles starts "
                       "one on 127.0.0.1 and fills this in, when the run talks HTTP: docs/rollout.md)")
    group.add_argument("--sglang-router-port", type=int, default=None,
                       help="Port of that router (with --sglang-router-ip). (default: a free port of the router miles "
                       "starts)")
    group.add_argument("--sglang-router-policy", type=str, default=None,
                       help="The router's load-balancing policy (sglang-router's --policy: random, round_robin, "
                       "cache_aware, power_of_two, manual). (default: round_robin)")
    group.add_argument("--sglang-router-request-timeout-secs", type=int, default=14400,
                       help="Seconds the router waits for an engine's answer (sglang-router's "
                       "--request-timeout-secs). (default: %(default)s)")
    group.add_argument("--rollout-request-timeout", type=float, default=600.0,
                       help="Seconds a generate or reward function's HTTP request (miles.utils.http_utils.post) may "
                       "wait for its answer before the run stops naming it: a hung server is an error, never a hang. "
                       "(default: %(default)s)")


def add_checkpoint_and_logging_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checkpoints and logging")
    group.add_argument("--save", default=None, help="Folder to save checkpoints to. (default: no checkpoints)")
    group.add_argument(
        "--save-interval", type=int, default=None, help="Save every N rollouts (requires --save). (default: at the end only)"
    )
    group.add_argument(
        "--load",
        default=None,
        help="Resume from the latest complete checkpoint in this folder. It must hold one, unless it is also --save: "
        "then a relaunch resumes if a checkpoint exists and starts fresh otherwise.",
    )
    group.add_argument(
        "--critic-load",
        default=None,
        help="Critic checkpoint folder (the same rule, with --critic-save). (default: --load)",
    )
    group.add_argument("--critic-save", default=None, help="Critic save folder. (default: --save)")
    group.add_argument(
        "--eval-interval", type=int, default=25, help="Evaluate on the held-out split every N rollouts; 0 disables. (default: %(default)s)"
    )
    group.add_argument(
        "--log-dir",
        default=None,
        help="Run folder for metrics.jsonl and TensorBoard events. (default: runs/<time>-<driver>-<estimator>)",
    )
    group.add_argument(
        "--use-tensorboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Write TensorBoard events beside metrics.jsonl. (default: %(default)s)",
    )
    group.add_argument(
        "--save-plots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Draw the PNG curves into RUN_DIR/plots at the end of the run (a few seconds on a CPU; 'miles-plot "
        "RUN_DIR' draws them later from metrics.jsonl). (default: %(default)s)",
    )
    group.add_argument(
        "--use-wandb", action="store_true",
        help="Log the metrics to Weights & Biases too: online with a key (--wandb-key or $WANDB_API_KEY), else "
        "offline into the run folder (upload later with 'wandb sync RUN_DIR/wandb/offline-run-*'). Never stops a run.",
    )
    group.add_argument("--wandb-project", default=None, help="wandb project. (default: wandb's)")
    group.add_argument("--wandb-group", default=None, help="wandb group; also the run's name. (default: none)")
    group.add_argument("--wandb-team", default=None, help="wandb entity (team or user). (default: the key's)")
    group.add_argument("--wandb-key", default=None, help="wandb API key; without one the run logs offline. (default: $WANDB_API_KEY)")
    group.add_argument("--wandb-host", default=None, help="wandb server URL. (default: wandb's)")
    group.add_argument(
        "--wandb-mode", choices=["online", "offline", "disabled"], default=None,
        help="wandb mode, over $WANDB_MODE. (default: online with a key, else offline)",
    )
    group.add_argument("--wandb-dir", default=None, help="Folder of the wandb files. (default: the run folder)")
    group.add_argument("--wandb-run-id", default=None, help="Resume (or create) this wandb run id. (default: a new run)")
    group.add_argument(
        "--disable-wandb-random-suffix", action="store_false", dest="wandb_random_suffix",
        help="Do not add upstream's random 6-character suffix to the wandb group and run name.",
    )
    group.add_argument(
        "--ray-address", default=None, help="Join this Ray cluster (or $RAY_ADDRESS). (default: start a local one)"
    )
    group.add_argument(
        "--ray-placement-timeout",
        type=float,
        default=60.0,
        help="Seconds to wait for the run's CPU bundles before failing with an error. (default: %(default)s)",
    )


def help_epilog() -> str:
    """The end of ``--help``. Imports and parses the departures table only now: a launch that never prints its help
    (the contract's refusal above all) never pays for it."""
    from miles.config.departures import help_lines

    lines = [
        "every numeric flag's range, and every path and prompt file, is checked before Ray starts "
        "(docs/training.md, 'Checked at startup').",
        f"upstream miles' other flags are known and refused (hidden here): a launch that passes one stops before Ray "
        f"starts, naming each and why ({refused.DOCS}).",
        "",
        *help_lines(),
    ]
    return "\n".join(lines)
