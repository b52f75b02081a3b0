"""Training backends. ``--train-backend`` picks one; both train the same roles with the same step loop, loss,
snapshot store and runtime guard (``training_utils/``), and differ only in the model (``TrainModel``).

- ``torch``: a Hugging Face model in one process (the embedded default's backend);
- ``megatron``: megatron-core's GPTModel, converted from and to the Hugging Face layout (docs/megatron.md).

A backend is imported only when it is used, so the torch backend never imports megatron-core.
"""

from __future__ import annotations

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
