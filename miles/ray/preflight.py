"""What ``training_run`` checks in the driver process before Ray starts (docs/training.md#checked-at-startup).

Every check reads; none writes (the parsed ``--sglang-*`` settings are kept on ``args`` for the engines). A bad model folder, checkpoint, output folder, prompt file or reward function is a
``MilesConfigError`` (one ``error:`` line, exit 2) within a second or two of launch, and nothing has been
written anywhere when it is raised. The flag values themselves were checked earlier, by ``miles_validate_args``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from transformers import AutoConfig

from miles.backends.megatron_backend.support import check_megatron_backend
from miles.backends.training_utils import checkpoint
from miles.backends.training_utils.recompute import Recompute, recompute_problem
from miles.config.architecture import architecture_mismatches, checkpoint_architecture
from miles.models.hf import check_hf_checkpoint, dropout_overrides, load_tokenizer, weight_names
from miles.rollout.custom_generate import load_generate_function
from miles.rollout.data_source import load_prompts
from miles.rollout.dynamic_sampling import load_dynamic_filter
from miles.rollout.eval_config import dataset_flag, eval_datasets, load_eval_sets
from miles.rollout.prompt_tokens import encode_prompts
from miles.rollout.protocol import engine_class
from miles.rollout.router import check_router_words
from miles.rollout.rm import get_reward_fn
from miles.utils.errors import MilesConfigError

# Prompt files within both limits are tokenized up front: about one second of one CPU core even for the embedded
# character-level tokenizer (measured ~18 us a prompt plus ~0.8 us a character). Larger ones are checked batch by
# batch by the rollout engine, so a file of millions of prompts never delays the start.
PREFLIGHT_MAX_PROMPTS = 50_000
PREFLIGHT_MAX_PROMPT_CHARS = 1_000_000


def preflight(args) -> int:
    """Fail on bad input before Ray starts or anything is written (each check raises ``MilesConfigError``).

    Returns the number of training prompts.
    """
    folder = check_hf_checkpoint(args.hf_checkpoint)
    check_architecture_flags(args, folder)
    check_dropout(args, folder)
    check_recompute(args, folder)
    engine_class(args.rollout_backend).preflight(args)
    check_router_options(args)
    if args.train_backend == "megatron":
        check_megatron_backend(args.hf_checkpoint, tensor_parallel_size=args.tensor_model_parallel_size)
    if args.ref_load is not None and (args.use_kl_loss or args.kl_coef != 0):
        check_hf_checkpoint(args.ref_load, flag="--ref-load")
    check_checkpoint_to_load("--load", args.load, "actor", args.save, args.train_backend,
                             args.tensor_model_parallel_size)
    outputs = [("--save", args.save), ("--log-dir", args.log_dir)]
    if args.use_critic:
        check_checkpoint_to_load("--critic-load", args.critic_load, "critic", args.critic_save, args.train_backend,
                                 args.tensor_model_parallel_size)
        outputs.append(("--critic-save", args.critic_save))
    for flag, folder in outputs:
        check_writable_folder(flag, folder)
    prompts = load_prompts(args, args.prompt_data, "--prompt-data")
    prompt_files = [("--prompt-data", args.prompt_data, prompts, (args.rollout_max_response_len,
                                                                   "--rollout-max-response-len"))]
    datasets = eval_datasets(args)  # --eval-config or --eval-prompt-data: keys, values and names checked
    for dataset, eval_prompts in load_eval_sets(args, datasets):
        budget = (dataset.max_response_len, "its max_response_len" if args.eval_config else "--eval-max-response-len")
        prompt_files.append((dataset_flag(args, dataset), dataset.path, eval_prompts, budget))
    check_prompts_fit(args, prompt_files)
    get_reward_fn(args.rm_type, args.custom_rm_path)
    if args.custom_generate_function_path:
        load_generate_function(args.custom_generate_function_path)  # importable, async, upstream's signature
    for dataset in datasets:
        try:
            get_reward_fn(dataset.rm_type, args.custom_rm_path)
        except MilesConfigError as error:
            raise MilesConfigError(f"{dataset_flag(args, dataset)} (rm_type {dataset.rm_type!r}): {error}") from None
    load_dynamic_filter(args.dynamic_sampling_filter_path)
    return len(prompts)


def check_router_options(args) -> None:
    """The --router-* words, by sglang-router's own parser: kept as ``args.router_cli_words`` for the router miles
    starts, and their values as upstream's ``args.router_*``."""
    args.router_cli_words, values = check_router_words(getattr(args, "router_words", []))
    for dest, value in values.items():
        setattr(args, dest, value)


def check_architecture_flags(args, folder) -> None:
    """The model-architecture flags the launch passed agree with the checkpoint (miles/config/architecture.py)."""
    given = getattr(args, "architecture_given", {})
    if not given:
        return
    config = json.loads((folder / "config.json").read_text())
    problems = architecture_mismatches(given, checkpoint_architecture(config, weight_names(folder)))
    if problems:
        raise MilesConfigError(
            f"the model-architecture flags disagree with --hf-checkpoint {args.hf_checkpoint}: {'; '.join(problems)}. "
            "miles builds the model from the checkpoint: fix the flags (upstream's scripts/models file for this "
            "model) or drop them."
        )


def check_dropout(args, folder) -> None:
    """--attention-dropout / --hidden-dropout: on --train-backend torch the model must have the config field to
    set; megatron's GPTModel has both dropouts (its RNG tracker seeds them, on CPU the shim's: docs/megatron.md)."""
    if args.train_backend == "torch" and (args.attention_dropout or args.hidden_dropout):
        dropout_overrides(json.loads((folder / "config.json").read_text()), args.attention_dropout,
                          args.hidden_dropout)


def check_recompute(args, folder) -> None:
    """The recompute flags as Megatron's rules and the backend allow (``training_utils.recompute``)."""
    recompute = Recompute.from_args(args)
    if recompute == Recompute():
        return
    layers = AutoConfig.from_pretrained(str(folder), local_files_only=True).num_hidden_layers  # any family's name
    problem = recompute_problem(recompute, args.train_backend, layers)
    if problem is not None:
        raise MilesConfigError(problem)


def check_rollouts_left(args) -> None:
    """A resume whose checkpoint already reached --num-rollout has nothing to train: say so before Ray starts."""
    saved = checkpoint.latest_rollout_id(args.load) if args.load else None
    start = args.start_rollout_id if args.start_rollout_id is not None else (saved + 1 if saved is not None else 0)
    if start >= args.num_rollout:
        raise MilesConfigError(
            f"there is nothing to train: the run would start at rollout {start}"
            + (f" (--load {args.load} holds rollout {saved})" if saved is not None else "")
            + f", but --num-rollout is {args.num_rollout}. Raise --num-rollout to train further."
        )


def check_checkpoint_to_load(flag: str, root: str | None, role: str, save_root: str | None,
                             train_backend: str = "torch", tensor_parallel_size: int = 1) -> None:
    """``root`` holds a complete, loadable checkpoint of ``role`` at its latest marker, saved by ``train_backend``
    at ``tensor_parallel_size``.

    A folder with no checkpoint yet (missing, or without a latest marker) is allowed only when it is also the
    role's save folder: then relaunching the same command resumes when a checkpoint exists and starts fresh
    otherwise (upstream's ``--load X --save X`` idiom). Anywhere else it is a typo that would silently start over.
    """
    if root is None:
        return
    folder = Path(root).expanduser()
    saves_here = save_root is not None and Path(save_root).expanduser().resolve() == folder.resolve()
    if folder.exists() and not folder.is_dir():
        raise MilesConfigError(f"{flag} {root!r} is a file, not a checkpoint folder. Pass the --save folder of a run.")
    rollout_id = checkpoint.latest_rollout_id(root) if folder.is_dir() else None
    if rollout_id is None:
        if saves_here:
            return
        what = "does not exist" if not folder.exists() else f"holds no checkpoint (no {checkpoint.LATEST_FILE})"
        raise MilesConfigError(
            f"{flag} {root!r} {what}, so there is nothing to resume. Pass the --save folder of an earlier run, or "
            f"drop {flag} to start from --hf-checkpoint; to resume-or-start-fresh, pass the same folder to "
            f"{flag} and {'--save' if role == 'actor' else '--critic-save'}."
        )
    role_dir = checkpoint.rollout_dir(root, rollout_id) / role
    fix = (f"Restore it, or write the id of an earlier complete rollout into {folder / checkpoint.LATEST_FILE}, "
           f"or drop {flag} to start from --hf-checkpoint.")
    if not role_dir.is_dir():
        raise MilesConfigError(
            f"{flag} {root!r}: its latest marker names rollout {rollout_id}, but {role_dir} does not exist "
            f"(deleted, moved, or saved without a {role}). {fix}"
        )
    check_hf_checkpoint(str(role_dir), flag=f"{flag} {root!r}: the checkpoint of rollout {rollout_id},", fix=fix)
    try:
        trainer_state = checkpoint.load_trainer_state(role_dir, mmap=True)
    except Exception as exc:  # torch.load fails in many ways (zip, pickle, EOF) on a damaged file
        raise MilesConfigError(
            f"{flag} {root!r}: {role_dir / checkpoint.TRAINER_STATE_FILE} cannot be loaded "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'damaged'}). {fix}"
        ) from None
    checkpoint.check_same_train_backend(trainer_state, role_dir, train_backend)
    checkpoint.check_same_tensor_parallel_size(trainer_state, role_dir, tensor_parallel_size)


def check_writable_folder(flag: str, path: str | None) -> None:
    """``path`` is a folder, or can be created as one, on a writable file system.

    Probed by creating an anonymous temporary file in ``path`` or its nearest existing parent (it is gone when
    closed), so the probe leaves nothing behind and creates no folder of a run that may still be rejected.
    """
    if path is None:
        return
    target = Path(path).expanduser()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise MilesConfigError(
            f"{flag} {path!r} cannot be a folder: {existing} is a file. Pass a folder path that has no file in it."
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise MilesConfigError(
            f"{flag} {path!r} is not writable: creating a file in {existing} failed ({exc.strerror or exc}). Pass a "
            f"folder on a writable file system where you have write permission."
        ) from None


def check_prompts_fit(args, prompt_files: list[tuple[str, str, list[dict], tuple[int, str]]]) -> None:
    """Each prompt tokenizes and fits the model's positions with its file's response budget (--rollout-max-response-len,
    an evaluation dataset's max_response_len: ``encode_prompts``), checked here when the files are within the
    ``PREFLIGHT_MAX_*`` limits; otherwise by the engine."""
    all_items = [item for _, _, items, _ in prompt_files for item in items]
    if (len(all_items) > PREFLIGHT_MAX_PROMPTS
            or sum(len(item["prompt"]) for item in all_items) > PREFLIGHT_MAX_PROMPT_CHARS):
        return
    tokenizer = load_tokenizer(args.hf_checkpoint)
    config = AutoConfig.from_pretrained(args.hf_checkpoint, local_files_only=True)
    max_positions = getattr(config, "max_position_embeddings", None)
    for flag, path, items, (budget, budget_name) in prompt_files:
        texts = [item["prompt"] for item in items]
        prompt_ids = encode_prompts(tokenizer, texts, max_positions, budget,
                                    lambda i: f"{flag} {path!r} prompt {i + 1} ({texts[i]!r})", budget_name)
        if prompt_ids:
            engine_class(args.rollout_backend).check_prompt_capacity(args, prompt_ids)
