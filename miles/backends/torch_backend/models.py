"""The torch backend: the actor and the critic are Hugging Face models in one process (``--train-backend torch``).

Models load through ``miles.models.hf`` (fp32, local files only), the same loader the rollout engine uses, so the
engine and the trainer compute log-probs with the same model class, dtype and attention implementation. The
native layout is the Hugging Face layout, so the weight push and the checkpoints need no conversion.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from miles.backends.training_utils.recompute import Recompute, checkpointed_layers
from miles.backends.training_utils.responses import gather_response_log_probs, gather_response_values, pad_right
from miles.backends.training_utils.train_model import StateDict, TrainModel
from miles.models.hf import load_role_model
from miles.utils.errors import MilesConfigError
from miles.utils.types import Sample


def response_log_probs(
    model: torch.nn.Module, samples: list[Sample], temperature: float, with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-sample log-probs (and entropies) of the response tokens of a HF causal LM, each 1-D of response_length."""
    input_ids, attention_mask = pad_right(samples)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    return gather_response_log_probs(logits, input_ids, samples, temperature, with_entropy, chunk_size)


def response_values(model: torch.nn.Module, samples: list[Sample]) -> list[torch.Tensor]:
    """Per-sample critic values V_t of the response tokens (1-D, response_length), read at the predicting position."""
    input_ids, attention_mask = pad_right(samples)
    scores = model(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1)  # (B, T)
    return gather_response_values(scores, samples)


def enable_recompute(model: torch.nn.Module, recompute: Recompute) -> None:
    """Activation recompute on a Hugging Face model: transformers' activation checkpointing of the decoder layers
    that ``checkpointed_layers`` names (non-reentrant ``torch.utils.checkpoint``, which restores the CPU
    random-number state before the replay, so a dropout mask is drawn again identically). It acts only in a
    training forward with gradients; the log-prob passes run as before."""
    if recompute.granularity is None:
        return
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    chosen = checkpointed_layers(recompute, model.config.num_hidden_layers)
    if not model.supports_gradient_checkpointing or len(layers) != len(chosen):
        raise MilesConfigError(
            f"--recompute-granularity {recompute.granularity}: the model ({type(model).__name__}) has no gradient "
            f"checkpointing per decoder layer in transformers ({len(layers)} checkpointable layers for "
            f"{len(chosen)}); drop the recompute flags, or --train-backend megatron for a Qwen2 model"
        )
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for layer, on in zip(layers, chosen, strict=True):
        layer.gradient_checkpointing = on


class HFTrainModel(TrainModel):
    """A Hugging Face causal LM (the actor) or token-classification critic, trained as it is."""

    @classmethod
    def load(cls, role: str, hf_folder: str, recompute: Recompute = Recompute(), **dropout) -> HFTrainModel:
        module = load_role_model(role, hf_folder, **dropout)
        enable_recompute(module, recompute)
        return cls(module)

    def response_log_probs(self, samples, temperature, with_entropy=False, chunk_size=None):
        return response_log_probs(self.module, samples, temperature, with_entropy, chunk_size)

    def response_values(self, samples):
        return response_values(self.module, samples)

    def hf_state_dict(self, native_state: Mapping[str, object] | None = None) -> StateDict:
        state = self.module.state_dict() if native_state is None else native_state
        return {name: tensor.detach().clone() for name, tensor in state.items()}

    native_layout_is_hf = True

    def hf_tensors(self, native_state: Mapping[str, object]) -> StateDict:
        return {name: tensor.detach() for name, tensor in native_state.items()}  # the HF layout already

    def save_pretrained(self, folder, hf_state=None) -> None:
        """The module's own weights, or ``hf_state`` (another pushed version's, for a checkpoint)."""
        self.module.save_pretrained(folder, state_dict=hf_state, safe_serialization=True)
