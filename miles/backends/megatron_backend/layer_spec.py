"""The layers of miles' GPTModel: megatron's local (pure torch) layer spec, with a norm sequence parallelism accepts.

megatron's local spec builds its norms with ``WrappedTorchNorm``, which returns torch's own ``RMSNorm`` but refuses
``sequence_parallel``. ``RMSNorm`` below is that same torch module, built the way megatron builds a norm, and
marks its weight as megatron's own norms do: under sequence parallelism each tensor-parallel rank normalizes its
slice of the sequence, so each rank's gradient of the weight is a partial sum (``parallel.sum_partial_gradients``
adds them up). Without sequence parallelism the model is the local spec's, parameter for parameter.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from miles.backends.megatron_backend.cpu_shim import quiet_megatron_warnings

with quiet_megatron_warnings():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules


class RMSNorm(torch.nn.RMSNorm):
    """y = x / sqrt(mean(x^2) + eps) * w over the last dimension (torch's RMSNorm), built from megatron's config."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel  # megatron's mark for the gradient sum


def gpt_block_spec(num_layers: int, qk_layernorm: bool) -> TransformerBlockSubmodules:
    """The block of ``num_layers`` local-spec layers (RMSNorm, GQA, SwiGLU; q/k RMSNorm for Qwen3) and the final
    norm, every norm an ``RMSNorm``."""
    layer = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=qk_layernorm)
    attention = layer.submodules.self_attention
    if qk_layernorm:
        attention = replace(attention, submodules=replace(attention.submodules, q_layernorm=RMSNorm,
                                                          k_layernorm=RMSNorm))
    layer = replace(layer, submodules=replace(layer.submodules, input_layernorm=RMSNorm, pre_mlp_layernorm=RMSNorm,
                                              self_attention=attention))
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)
