"""The megatron backend (``--train-backend megatron``): the actor and the critic on megatron-core's GPTModel.

- ``support.py``: what the backend can train, checked in the driver before Ray starts (imports no megatron);
- ``cpu_shim.py``: the two overrides that let megatron-core run without CUDA, each pinned and tested;
- ``parallel.py``: the process group and megatron's parallel state, and the tensor-parallel-aware gradient clip;
- ``qwen2.py``: Hugging Face Qwen2 <-> Megatron weight names and layouts, as a table, both directions;
- ``model.py``: GPTModel from a Hugging Face config, the critic's scalar head, and ``MegatronTrainModel``.

docs/megatron.md says how to run it and what changes on a GPU.
"""
