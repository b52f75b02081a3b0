"""megatron-core's GPTModel as a miles ``TrainModel``: built from a Hugging Face Qwen2 or Qwen3 config, loaded and
saved in the Hugging Face layout.

- The actor is GPTModel with the local layer spec (RMSNorm, GQA, SwiGLU, RoPE; qkv bias for Qwen2, q/k RMSNorm for
  Qwen3; ``layer_spec.py``), its weights converted from the HF checkpoint (``qwen2.py``), so it starts from exactly
  the torch backend's weights.
- The critic is the same GPTModel whose output layer is a scalar head with bias, Megatron's stand-in for HF's
  token-classification ``score`` layer. It is converted from the HF critic that ``miles.models.hf`` builds, so a
  new head starts from the torch backend's initialization, bit for bit, under the same seed.
- Every forward pass gets an explicit causal mask (True = masked): with ``attention_mask=None`` megatron builds one
  on CUDA. Right padding needs nothing more, since real tokens never attend to the pads after them.
- With tensor parallelism (``tensor_parallel.py``) each rank holds its shards of the converted whole state; the
  vocabulary is padded to a multiple of the tensor-parallel size, the vocabulary-parallel logits are gathered
  (``tensor_parallel.gather_last_dim``) and the padded columns dropped before the shared log-softmax; the Hugging Face
  layout (push, fingerprint, snapshots' check, checkpoints) is always the gathered whole. Under sequence parallelism
  the batch is right-padded to a multiple of the tensor-parallel size (megatron splits the sequence evenly); the
  extra positions come after every real token, so causal attention keeps them out, and they are cut off the output.
- Outputs come back on the CPU (where the shared loss code keeps the batch); on a GPU that transfer is the one
  place a later optimization would change (docs/megatron.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from miles.backends.megatron_backend.cpu_shim import quiet_megatron_warnings
from miles.backends.megatron_backend.layer_spec import gpt_block_spec
from miles.backends.megatron_backend.parallel import (
    Parallelism,
    clip_grad_norm,
    initialize_model_parallel,
    sum_partial_gradients,
)
from miles.backends.megatron_backend.qwen2 import Qwen2Layout, hf_to_megatron, megatron_to_hf
from miles.backends.megatron_backend.tensor_parallel import (
    gather_last_dim,
    gather_state,
    padded_vocab_size,
    partition_dims,
    shard_state,
)
from miles.backends.training_utils.recompute import Recompute
from miles.backends.training_utils.responses import gather_response_log_probs, gather_response_values, pad_right
from miles.backends.training_utils.train_model import StateDict, TrainModel
from miles.models.hf import load_role_model
from miles.utils.types import Sample

with quiet_megatron_warnings():
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
    from megatron.core.transformer import TransformerConfig


def transformer_config(hf_config, use_cpu_initialization: bool, parallel: Parallelism = Parallelism(),
                       dropout: dict | None = None, recompute: Recompute = Recompute()) -> TransformerConfig:
    """Megatron's config for a Hugging Face Qwen2/Qwen3 config; fusions off (they need CUDA kernels), fp32. ``dropout``:
    --attention-dropout / --hidden-dropout (0 when absent), Megatron's own fields: the attention probabilities'
    dropout under the RNG tracker's model-parallel state, the hidden states' (after attention and after the MLP)
    under the default one; ``recompute``: Megatron's recompute fields."""
    dropout = dropout or {}
    layout = Qwen2Layout.from_hf_config(hf_config, "actor")
    return TransformerConfig(
        tensor_model_parallel_size=parallel.tensor_parallel_size,
        sequence_parallel=parallel.splits_sequence,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=layout.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_layernorm,
        hidden_dropout=dropout.get("hidden_dropout", 0.0),
        attention_dropout=dropout.get("attention_dropout", 0.0),
        **recompute.megatron_fields(),
        params_dtype=torch.float32,
        use_cpu_initialization=use_cpu_initialization,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )


def rope_theta(hf_config) -> float:
    rope = getattr(hf_config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


class ScalarHead(torch.nn.Module):
    """The critic's output layer, V = w · h + b, called the way GPTModel calls its output layer. It is replicated on
    every tensor-parallel rank, so under sequence parallelism it first gathers the whole sequence (whose gradient
    each rank then takes its own slice of: the head's computation is the same on every rank)."""

    def __init__(self, hidden_size: int, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:  # (S / TP, B, H) -> (S, B, H)
            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None  # (S, B, 1)


def build_gpt_model(hf_config, role: str, use_cpu_initialization: bool, parallel: Parallelism = Parallelism(),
                    dropout: dict | None = None, recompute: Recompute = Recompute()) -> GPTModel:
    """GPTModel shaped like ``hf_config`` (one tensor-parallel rank's part of it); the critic's has the scalar head
    and untied embeddings."""
    config = transformer_config(hf_config, use_cpu_initialization, parallel, dropout, recompute)
    with quiet_megatron_warnings():
        model = _gpt_model(hf_config, role, config, parallel.tensor_parallel_size)
    if role == "critic":
        model.output_layer = ScalarHead(hf_config.hidden_size, parallel.splits_sequence)
    return model


def _gpt_model(hf_config, role: str, config: TransformerConfig, tensor_parallel_size: int) -> GPTModel:
    return GPTModel(
        config=config,
        transformer_layer_spec=gpt_block_spec(hf_config.num_hidden_layers,
                                              Qwen2Layout.from_hf_config(hf_config, role).qk_layernorm),
        vocab_size=padded_vocab_size(hf_config.vocab_size, tensor_parallel_size),
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings) and role == "actor",
    )


def load_converted(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load converted weights; every parameter must be covered (only megatron's ``_extra_state`` may be absent)."""
    result = module.load_state_dict(state, strict=False)
    missing = [name for name in result.missing_keys if not name.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise KeyError(f"converted weights do not fit GPTModel: missing {missing}, unexpected {result.unexpected_keys}")


def causal_mask(batch_size: int, length: int) -> torch.Tensor:
    """(B, 1, T, T) boolean, True where attention is masked: every key after the query."""
    return torch.ones(length, length, dtype=torch.bool).triu(diagonal=1).expand(batch_size, 1, length, length)


class MegatronTrainModel(TrainModel):
    def __init__(self, module: GPTModel, hf_config, role: str, device: torch.device,
                 parallel: Parallelism = Parallelism()) -> None:
        super().__init__(module)
        self.parallel = parallel
        self.hf_config = hf_config
        self.role = role
        self.layout = Qwen2Layout.from_hf_config(hf_config, role)
        self.device = device
        self.partition_dims = partition_dims(module)  # of the tensor-parallel parameters (none at size 1)
        self.tensor_parallel_group = parallel_state.get_tensor_model_parallel_group()

    @classmethod
    def load(cls, role: str, hf_folder: str, seed: int, parallel: Parallelism = Parallelism(),
             dropout: dict | None = None, recompute: Recompute = Recompute()) -> MegatronTrainModel:
        """Build GPTModel for ``role`` (this rank's part of it) and convert the weights of the HF model in
        ``hf_folder`` into it."""
        device = initialize_model_parallel(seed, parallel.tensor_parallel_size)
        hf_model = load_role_model(role, hf_folder)  # the loader the torch backend uses: same weights, same init
        module = build_gpt_model(hf_model.config, role, device.type == "cpu", parallel, dropout, recompute)
        model = cls(module, hf_model.config, role, device, parallel)
        whole = hf_to_megatron(hf_model.state_dict(), model.layout)
        load_converted(module, shard_state(whole, model.partition_dims, parallel_state.get_tensor_model_parallel_rank(),
                                           parallel.tensor_parallel_size, hf_model.config.vocab_size))
        return model.to_device()

    def to_device(self) -> MegatronTrainModel:
        self.module.to(self.device)
        return self

    def _forward(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        """GPTModel's output (B, T, padded V or 1) on the CPU, and the input ids (B, T); the actor's logits are
        gathered from every tensor-parallel rank (a no-op at size 1)."""
        input_ids, _ = pad_right(samples)
        length = input_ids.shape[1]
        if self.parallel.splits_sequence:  # megatron splits the sequence in equal slices, one per rank
            input_ids = torch.nn.functional.pad(input_ids, (0, -length % self.parallel.tensor_parallel_size))
        batch_size, padded_length = input_ids.shape
        position_ids = torch.arange(padded_length).expand(batch_size, padded_length)
        output = self.module(input_ids.to(self.device), position_ids.to(self.device),
                             causal_mask(batch_size, padded_length).to(self.device))
        if self.role == "actor":
            output = gather_last_dim(output, self.tensor_parallel_group)  # (B, T, padded V / TP) -> (B, T, padded V)
        return output[:, :length].cpu(), input_ids[:, :length]

    def response_log_probs(self, samples, temperature, with_entropy=False, chunk_size=None):
        logits, input_ids = self._forward(samples)  # (B, T, padded V)
        logits = logits[..., : self.hf_config.vocab_size]  # (B, T, V): the padding's columns are no tokens
        return gather_response_log_probs(logits, input_ids, samples, temperature, with_entropy, chunk_size)

    def response_values(self, samples):
        scores, _ = self._forward(samples)  # (B, T, 1)
        return gather_response_values(scores.squeeze(-1), samples)

    def on_every_rank(self, flag: bool) -> bool:
        if torch.distributed.get_world_size(self.tensor_parallel_group) == 1:
            return flag
        value = torch.tensor([int(flag)], dtype=torch.int32)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN, group=self.tensor_parallel_group)
        return bool(value.item())

    def hf_state_dict(self, native_state: Mapping[str, object] | None = None) -> StateDict:
        state = self.module.state_dict() if native_state is None else native_state
        whole = gather_state(state, self.partition_dims, self.hf_config.vocab_size, self.tensor_parallel_group)
        return {name: tensor.cpu() for name, tensor in megatron_to_hf(whole, self.layout).items()}

    def save_pretrained(self, folder, hf_state: StateDict | None = None) -> None:
        """An ordinary HF folder (either backend loads it): the HF model is built on the meta device (no
        allocation), given the converted tensors, and saved by transformers."""
        auto_class = AutoModelForTokenClassification if self.role == "critic" else AutoModelForCausalLM
        with torch.device("meta"):
            hf_model = auto_class.from_config(self.hf_config, dtype=torch.float32)
        hf_model.load_state_dict(self.hf_state_dict() if hf_state is None else hf_state, assign=True)
        hf_model.tie_weights()
        hf_model.save_pretrained(folder)

    @property
    def tensor_parallel_rank(self) -> int:
        return dist.get_rank(self.tensor_parallel_group)

    def gather_over_tensor_parallel(self, obj) -> list:
        gathered = [None] * dist.get_world_size(self.tensor_parallel_group)
        dist.all_gather_object(gathered, obj, group=self.tensor_parallel_group)
        return gathered

    def clip_grad_norm(self, max_norm: float) -> float:
        """The first reader of the step's gradients (after the data-parallel sum): the partial tensor-parallel
        gradients are completed here, so the norm, the clip and the optimizer all see whole gradients."""
        sum_partial_gradients(self.module.named_parameters())
        return clip_grad_norm(list(self.module.parameters()), max_norm)
