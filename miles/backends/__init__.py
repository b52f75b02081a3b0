"""Training backends. ``--train-backend`` picks one; both train the same roles with the same step loop, loss,
snapshot store and runtime guard (``training_utils/``), and differ only in the model (``TrainModel``).

- ``torch``: a Hugging Face model in one process (the embedded default's backend);
- ``megatron``: megatron-core's GPTModel, converted from and to the Hugging Face layout (docs/megatron.md).

A backend is imported only when it is used, so the torch backend never imports megatron-core. The train processes
that compose a backend's model with the shared parts live in this package too (``train_process.py``), above both
backends (docs/design.md §6); ``ModelSpec`` is how they load their models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from miles.config.flags import TRAIN_BACKENDS  # noqa: F401  (the names --train-backend accepts)


def load_train_model(backend: str, role: str, hf_folder: str, seed: int, tensor_parallel_size: int = 1,
                     dropout: dict | None = None, recompute=None, sequence_parallel: bool = False):
    """The ``TrainModel`` of ``role`` ("actor" or "critic") on ``backend``, loaded from a Hugging Face folder.

    ``seed`` seeds torch before loading, so a new critic head is initialized the same way on both backends;
    ``tensor_parallel_size`` > 1 (megatron only) loads this rank's shards, split along the sequence as well with
    ``sequence_parallel`` (at size 1 there is nothing to split: the same model on either backend). ``dropout``:
    --attention-dropout / --hidden-dropout as ``load_role_model``'s keywords; ``recompute``: a ``training_utils.recompute.Recompute``
    (none by default).
    """
    import torch

    from miles.backends.training_utils.recompute import Recompute

    dropout, recompute = dropout or {}, recompute or Recompute()

    torch.manual_seed(seed)
    if backend == "torch":
        from miles.backends.torch_backend.models import HFTrainModel

        return HFTrainModel.load(role, hf_folder, recompute, **dropout)
    if backend == "megatron":
        from miles.backends.megatron_backend.model import MegatronTrainModel
        from miles.backends.megatron_backend.parallel import Parallelism

        parallel = Parallelism(tensor_parallel_size, sequence_parallel)
        return MegatronTrainModel.load(role, hf_folder, seed, parallel, dropout, recompute)
    raise ValueError(f"unknown train backend {backend!r}; valid: {', '.join(TRAIN_BACKENDS)}")


@dataclass(frozen=True)
class ModelSpec:
    """How a train process loads its models (``load_train_model``'s settings), built once from ``args``."""

    backend: str  # --train-backend
    tensor_parallel_size: int
    sequence_parallel: bool
    seed: int  # the actor's; the critic's is seed + 1, so a new value head is not the actor's draw
    dropout: dict = field(default_factory=dict)  # --attention-dropout / --hidden-dropout (trained roles only)
    recompute: object = None  # a training_utils.recompute.Recompute (trained roles only)
    reference_folder: str | None = None  # the KL reference's weights (--ref-load, else the base); None: no reference

    @classmethod
    def from_args(cls, args) -> ModelSpec:
        from miles.backends.training_utils.recompute import Recompute

        needs_reference = args.use_kl_loss or args.kl_coef != 0
        return cls(args.train_backend, args.tensor_model_parallel_size, args.sequence_parallel, args.seed,
                   {"attention_dropout": args.attention_dropout, "hidden_dropout": args.hidden_dropout},
                   Recompute.from_args(args), (args.ref_load or args.hf_checkpoint) if needs_reference else None)

    def load_trained(self, role: str, folder: str):
        """The model a role trains (its dropout and recompute on)."""
        seed = self.seed + (role == "critic")
        return load_train_model(self.backend, role, folder, seed, self.tensor_parallel_size, self.dropout,
                                self.recompute, self.sequence_parallel)

    def load_frozen(self, folder: str):
        """Actor weights that are never trained (the KL reference, a saved pushed version): no dropout, no
        recompute, evaluated only."""
        return load_train_model(self.backend, "actor", folder, self.seed, self.tensor_parallel_size,
                                sequence_parallel=self.sequence_parallel)
