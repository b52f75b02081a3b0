"""Activation recompute (--recompute-granularity / --recompute-method / --recompute-num-layers /
--recompute-modules): Megatron's meanings, the rules Megatron's ``TransformerConfig`` checks, and which layers the
torch backend checkpoints. Standard library only: the preflight checks a launch with it before Ray starts.

Recompute changes what the forward pass keeps for the backward pass, never the numbers: a recomputed layer runs
its forward again in the backward pass, with the random-number state of the first run (the same dropout masks), so
the loss and the gradients are those of the plain step up to float rounding (tests/fast/backends/test_recompute.py).

- ``full`` (both backends): whole transformer layers. ``uniform`` recomputes every layer, keeping only the input of
  each chunk of ``num_layers`` layers; ``block`` recomputes the first ``num_layers`` layers and keeps the
  activations of the others. The torch backend checkpoints one Hugging Face decoder layer at a time (transformers'
  gradient checkpointing), so there ``uniform`` takes chunks of 1 only.
- ``selective`` (megatron backend): the parts of every layer named by ``modules`` (Megatron's default core_attn).
"""

from __future__ import annotations

from dataclasses import dataclass

GRANULARITIES = ("full", "selective")
METHODS = ("uniform", "block")
# Megatron's selective modules that the megatron backend can recompute: its others (moe_act, moe, shared_experts,
# mla_up_proj) are parts of MoE and multi-latent-attention layers, which the backend does not build, and
# "layernorm" goes through megatron-core's CheckpointWithoutOutput, which needs Transformer Engine (its FP8 state).
DENSE_MODULES = ("core_attn", "mlp")
MEGATRON_DEFAULT_MODULES = ("core_attn",)


@dataclass(frozen=True)
class Recompute:
    granularity: str | None = None  # None: keep every activation (no recompute)
    method: str | None = None
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None

    @classmethod
    def from_args(cls, args) -> Recompute:
        modules = args.recompute_modules
        return cls(args.recompute_granularity, args.recompute_method, args.recompute_num_layers,
                   None if modules is None else tuple(modules))

    def megatron_fields(self) -> dict:
        """The ``TransformerConfig`` keywords (Megatron's own names and meanings)."""
        return {"recompute_granularity": self.granularity, "recompute_method": self.method,
                "recompute_num_layers": self.num_layers,
                "recompute_modules": list(self.modules or MEGATRON_DEFAULT_MODULES)}


def recompute_problem(recompute: Recompute, backend: str, model_layers: int) -> str | None:
    """Why this recompute cannot run as asked (one line: the values, the rule, the fix), or None.

    Megatron's rules: full needs a method and 1 <= num_layers <= the layers (uniform: a divisor of them, which
    megatron-core's chunk loop assumes); selective takes no num_layers. miles
    adds the ones where Megatron would accept a value and ignore it (a method or modules that the granularity does
    not read, any of them without a granularity) and the torch backend's limits.
    """
    g, method, n, modules = recompute.granularity, recompute.method, recompute.num_layers, recompute.modules
    given = " ".join(f"--recompute-{name} {value if not isinstance(value, tuple) else ' '.join(value)}"
                     for name, value in (("granularity", g), ("method", method), ("num-layers", n),
                                         ("modules", modules)) if value is not None)
    if g is None:
        return None if not given else (f"{given}: recompute needs --recompute-granularity full or selective; "
                                       "pass it, or drop these")
    if g == "full":
        if method is None or n is None:
            return (f"{given}: --recompute-granularity full needs --recompute-method (uniform or block) and "
                    f"--recompute-num-layers (1 to {model_layers}), as Megatron; e.g. --recompute-method uniform "
                    "--recompute-num-layers 1")
        if not 1 <= n <= model_layers:
            return f"{given}: --recompute-num-layers must be 1 to the model's {model_layers} layers"
        if modules is not None:
            return f"{given}: --recompute-modules is read with --recompute-granularity selective only; drop it"
        if backend == "torch" and method == "uniform" and n != 1:
            return (f"{given}: --train-backend torch recomputes one Hugging Face decoder layer at a time "
                    "(transformers' gradient checkpointing), so uniform chunks are of 1 layer; pass "
                    "--recompute-num-layers 1, or --train-backend megatron")
        if method == "uniform" and model_layers % n:
            return (f"{given}: uniform chunks of {n} layers must divide the model's {model_layers} layers "
                    "(megatron-core's chunk loop reads past the last layer otherwise); pass a divisor")
        return None
    if method is not None or n is not None:
        return (f"{given}: --recompute-granularity selective takes no --recompute-method or --recompute-num-layers "
                "(Megatron: full only); drop them")
    unknown = [module for module in (modules or ()) if module not in DENSE_MODULES]
    if unknown or modules == ():
        return (f"{given}: --recompute-modules takes {' and '.join(DENSE_MODULES)} here (the MoE and MLA modules are "
                "not parts of the Qwen2 layers the megatron backend builds; megatron-core's layernorm recompute "
                "needs Transformer Engine)")
    if backend == "torch":
        return (f"{given}: --train-backend torch recomputes whole decoder layers only (transformers' gradient "
                "checkpointing); pass --recompute-granularity full --recompute-method uniform "
                "--recompute-num-layers 1, or --train-backend megatron")
    return None


def checkpointed_layers(recompute: Recompute, model_layers: int) -> list[bool]:
    """Per decoder layer, whether the torch backend recomputes it: every layer (full, uniform, chunks of 1), the
    first ``num_layers`` (full, block; Megatron's block on one pipeline stage), none without recompute."""
    if recompute.granularity is None:
        return [False] * model_layers
    if recompute.method == "block":
        return [index < recompute.num_layers for index in range(model_layers)]
    return [True] * model_layers
