"""The seam between the shared train processes and a training backend.

The actor and the critic (``train_process.py``), the step loop, the loss, the snapshot store, the fingerprint and
the runtime guard are one implementation for every backend. A backend supplies a ``TrainModel``: the trainable
module, its forward passes read as per-response-token log-probs or values, its weights in the Hugging Face layout
(what the rollout engines receive, what the push fingerprint is computed on, what checkpoints hold) and its
gradient-norm clip. The torch backend's is ``miles.backends.torch_backend.models.HFTrainModel``, the megatron
backend's ``miles.backends.megatron_backend.model.MegatronTrainModel``.

"Native" weights are the module's own ``state_dict()`` (for megatron: fused QKV, possibly sharded); the
keep-old-actor snapshots hold native weights, so a snapshot is loaded back without a conversion.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from miles.utils.types import Sample

StateDict = dict[str, torch.Tensor]


def clone_state(state: Mapping[str, object]) -> dict[str, object]:
    """A detached copy of a state dict; non-tensor entries (megatron's ``_extra_state``) are kept as they are."""
    return {name: value.detach().clone() if torch.is_tensor(value) else value for name, value in state.items()}


class TrainModel:
    """One role's trainable model. Subclasses implement the four backend methods below."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    # ---- what a backend supplies -------------------------------------------------------------------------------
    def response_log_probs(
        self, samples: list[Sample], temperature: float, with_entropy: bool = False, chunk_size: int | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Per-sample log-probs (and entropies) of the response tokens, each 1-D of response_length; the log-softmax
        ``chunk_size`` tokens at a time when given (``responses.gather_response_log_probs``)."""
        raise NotImplementedError

    def response_values(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-sample critic values V_t of the response tokens, each 1-D of response_length."""
        raise NotImplementedError

    def hf_state_dict(self, native_state: Mapping[str, object] | None = None) -> StateDict:
        """The weights (the module's, or ``native_state``) as new tensors in the Hugging Face layout."""
        raise NotImplementedError

    native_layout_is_hf = False  # True where ``module.state_dict()`` is already the HF layout (names and shapes)

    def on_every_rank(self, flag: bool) -> bool:
        """``flag`` held on every rank that shares this model's shards (a collective where there are several: every
        rank calls it), so that all of them take the same path before a gather."""
        return flag

    def hf_tensors(self, native_state: Mapping[str, object]) -> StateDict:
        """``native_state`` in the Hugging Face layout, to be read (hashed), never written: a backend whose native
        layout is the HF one returns its tensors without copying them."""
        return self.hf_state_dict(native_state)

    def save_pretrained(self, folder, hf_state: StateDict | None = None) -> None:
        """Write the weights (or ``hf_state``, already ``hf_state_dict()``) as a Hugging Face model folder
        (config.json + safetensors)."""
        raise NotImplementedError

    # ---- shared ------------------------------------------------------------------------------------------------
    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.module.parameters()

    def native_state_dict(self) -> dict[str, object]:
        return clone_state(self.module.state_dict())

    @contextlib.contextmanager
    def swapped_weights(self, native_state: Mapping[str, object]) -> Iterator[None]:
        """Run the block with ``native_state`` loaded, then put the live weights back (keep-old-actor's pass)."""
        live_state = self.native_state_dict()
        self.module.load_state_dict(native_state)
        try:
            yield
        finally:
            self.module.load_state_dict(live_state)

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        """No-grad evaluation passes (the denominator, the critic's old values), restoring the module's mode."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.module.train(was_training)

    # ---- tensor parallelism (none unless a backend overrides these) --------------------------------------------
    tensor_parallel_rank = 0

    def gather_over_tensor_parallel(self, obj) -> list:
        """Every tensor-parallel rank's ``obj``, in rank order (each rank of the group must call it)."""
        return [obj]

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the gradients so that their global 2-norm is at most ``max_norm``; return the norm before."""
        return float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm))
