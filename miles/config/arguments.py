"""Argument parsing, validation, and the async off-policy contract.

``parse_args`` builds the parser from the topic groups in ``miles/config/flags.py`` and runs
``miles_validate_args``, which derives the values upstream derives and enforces upstream's rules, one small
function per rule. ``validate_async_off_policy_correction`` is the contract ``train_async.py`` checks before
anything else (docs/async_off_policy_contract.md).

Importing this module imports no torch, ray, transformers, sglang or megatron: a rejected launch costs about
as much as starting Python.
"""

import argparse
import sys

from miles.config import corrections, flags, refused
from miles.config.architecture import DESTS as ARCHITECTURE_FLAG_DESTS, GROUPS_FLAGS
from miles.config.errors import AsyncOffPolicyCorrectionError, MilesConfigError
from miles.config.flag_rules import check_flag_values, flag_name
from miles.config.hooks import load_function
from miles.config.lr_schedule import check_lr_schedules
from miles.config.rank_layout import check_rank_layout
from miles.config.sglang_words import split_router_words, split_sglang_words


def contract_message(args=None) -> str:
    """The contract's error, its list of corrections from the table (``miles.config.corrections``), and why a row
    set on ``args`` that does not satisfy the contract is not one."""
    not_one = "".join(f"{row.flag} is set, but it is not one: {row.why}.\n" for row in corrections.CORRECTIONS
                      if not row.satisfies_contract and args is not None and getattr(args, row.dest, False))
    return (
        "Async PPO training requires an explicit behavior-policy correction: the async loop generates rollout k+1 "
        "before the weights trained on rollout k are pushed, so every rollout is stale by at least one update, and "
        "by default the PPO ratio denominator is recomputed by the current actor, a policy that never generated the "
        f"trajectory. Pass one of:\n{corrections.contract_choices()}\n{not_one}"
        "Every --tis-mode, --tis-level, --rs-* choice and --custom-tis-function-path is a form of --use-tis and needs "
        "it. --use-opsm alone is not a correction: its 'old' is still the current actor's, so it never sees the "
        "staleness.\n"
        "Or train synchronously with train.py. Check launch scripts with `miles-check SCRIPT.sh` "
        "(docs/async_off_policy_contract.md)."
    )


ASYNC_PPO_CORRECTION_MESSAGE = contract_message()  # the message for the table as shipped


def validate_async_off_policy_correction(args) -> None:
    """Refuse async PPO (``args.use_critic``) unless one behavior-policy correction is chosen.

    Reads exactly ``use_critic`` and, for PPO, the flag of each row of the corrections table that satisfies the
    contract (``use_rollout_logprobs``, ``use_tis`` and the snapshot one: docs/corrections.md). Every TIS variant
    (--tis-mode, --tis-level, --rs-level, --rs-veto-threshold, --custom-tis-function-path) counts, because each is
    applied only under --use-tis (``_check_tis_choices`` refuses them without it) and each re-weights or masks by
    π_old/π_rollout, the behavior policy's own probabilities. --use-opsm does not count: it masks by the mean
    (old − current) log ratio, whose "old" is the ratio's denominator, the current actor's unless one of the three
    changes it, so alone it measures 0 staleness and corrects nothing (docs/corrections.md). Critic-free
    estimators (GRPO, GSPO, REINFORCE++) return at once: upstream's compatibility choice, not a claim that they
    are safe (their data is just as stale; they get a warning and the run-time report instead).
    Raised explicitly (not ``assert``) so ``python -O`` cannot switch the contract off.
    """
    if not args.use_critic:
        return
    if not any(getattr(args, row.dest) for row in corrections.contract_corrections()):
        raise AsyncOffPolicyCorrectionError(contract_message(args))


def check_async_colocation(args) -> None:
    """Async training overlaps generation with training, so the engines cannot share the actor's resources."""
    if args.colocate:
        raise MilesConfigError(
            "--colocate is set, but train_async.py overlaps generation with training, so rollout engines cannot "
            "share the actor's resources. Drop --colocate, or train synchronously with train.py --colocate."
        )


def check_async_max_weight_staleness(args) -> None:
    """The async loop's worst case is --update-weights-interval rollouts of staleness (d(k) peaks at N)."""
    if args.max_weight_staleness is not None and args.update_weights_interval > args.max_weight_staleness:
        fix = (
            f"Pass --update-weights-interval {args.max_weight_staleness} or less."
            if args.max_weight_staleness >= 1
            else "Train synchronously with train.py (never stale), or allow at least 1."
        )
        raise MilesConfigError(
            f"--max-weight-staleness {args.max_weight_staleness} cannot hold: train_async.py with "
            f"--update-weights-interval {args.update_weights_interval} trains on data up to "
            f"{args.update_weights_interval} rollouts stale. {fix}"
        )


def async_staleness_warning(args) -> str | None:
    """The one startup warning for async runs that upstream exempts from the contract (critic-free, no correction)."""
    if args.use_critic or corrections.chosen(args):
        return None
    return (
        f"async {args.advantage_estimator} runs without a behavior-policy correction: its data is as stale as "
        "async PPO's (every rollout after the first is at least one update old) and its ratio is anchored to the "
        "current actor. It is accepted for upstream compatibility; add "
        f"{corrections.suggested_fix(corrections.SUGGESTED_FIRST_CRITIC_FREE)} to correct it. The off_policy/* "
        "metrics show the drift."
    )


correction_combination_note = corrections.combination_note  # the name callers import from here


def get_miles_extra_args_provider(add_custom_arguments=None):
    """Return ``add_miles_arguments(parser)``, which adds every miles flag group (upstream's hook name)."""

    def add_miles_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        flags.add_algorithm_arguments(parser)
        flags.add_off_policy_arguments(parser)
        flags.add_tis_variant_arguments(parser)
        flags.add_loop_arguments(parser)
        flags.add_optimizer_arguments(parser)
        flags.add_backend_arguments(parser)
        flags.add_dropout_arguments(parser)
        flags.add_recompute_arguments(parser)
        flags.add_batching_arguments(parser)
        flags.add_parallel_arguments(parser)
        flags.add_architecture_arguments(parser)
        flags.add_rollout_arguments(parser)
        flags.add_router_arguments(parser)
        flags.add_checkpoint_and_logging_arguments(parser)
        if not getattr(parser, "refused_flags_pending", False):  # else the parser adds them when it meets one
            refused.add_refused_arguments(parser)
        if add_custom_arguments is not None:
            add_custom_arguments(parser)
        return parser

    return add_miles_arguments


class _RefusedFlagsYield:
    """A flag that a driver's ``add_custom_arguments`` or a plug-in's ``add_arguments`` defines replaces the refused
    upstream flag of the same name (upstream's RLVE example defines ``--rlve`` this way): the code that defines it
    is what it means. Any other clash stays argparse's error."""

    def _handle_conflict_error(self, action, conflicting_actions):
        if all(isinstance(existing, refused.RefusedFlag) for _, existing in conflicting_actions):
            return self._handle_conflict_resolve(action, conflicting_actions)
        return super()._handle_conflict_error(action, conflicting_actions)


class _ArgumentGroup(_RefusedFlagsYield, argparse._ArgumentGroup):
    pass


class MilesArgumentParser(_RefusedFlagsYield, argparse.ArgumentParser):
    """miles' parser. What only ``--help`` or a refused flag needs waits until then, so a launch the contract refuses
    never reads the departures table (docs/benchmarks.md, "The contract's startup cost"): the epilog is rendered
    when first read, and with ``defer_refused_flags`` the refused upstream flags are registered when the parse
    first meets an option string it does not know (one of them, a typo, a negative number), before argparse
    resolves that string, so every parse and every error is the one the parser with them all would give."""

    def __init__(self, *args, defer_refused_flags: bool = False, **kwargs) -> None:
        self.refused_flags_pending = defer_refused_flags
        super().__init__(*args, **kwargs)

    @property
    def epilog(self) -> str | None:
        if self._epilog is None:
            self._epilog = flags.help_epilog()
        return self._epilog

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        self._epilog = value

    def _parse_optional(self, arg_string):
        if (self.refused_flags_pending and arg_string[:1] in self.prefix_chars
                and arg_string.split("=", 1)[0] not in self._option_string_actions):
            self.refused_flags_pending = False
            refused.add_refused_arguments(self)
        return super()._parse_optional(arg_string)

    def _check_value(self, action, value):
        """argparse's check of a choice; when upstream's parser accepts the value, the error also says why miles
        does not (an upstream launch's ``--train-backend fsdp`` reads as more than a typo)."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            from miles.config.departures import upstream_choice  # the table is read only for a refused choice

            departure = upstream_choice(action.option_strings, value)
            if departure is None:
                raise
            reason = f"{departure.why} (docs/training.md#departures-from-upstream)"
            raise argparse.ArgumentError(
                action, f"{error.message}; upstream's parser accepts {value!r}, miles does not: {reason}") from None

    def add_argument_group(self, *args, **kwargs) -> argparse._ArgumentGroup:
        group = _ArgumentGroup(self, *args, **kwargs)  # argparse's own body, with the group that yields
        self._action_groups.append(group)
        return group


def build_parser(add_custom_arguments=None, defer_refused_flags: bool = False) -> argparse.ArgumentParser:
    """miles' parser (the epilog, ``flags.help_epilog``, is rendered when ``--help`` reads it). ``parse_args`` defers
    the refused upstream flags (``MilesArgumentParser``); a caller that reads the parser's actions (miles-check,
    the conformance tools) gets them all at once."""
    parser = MilesArgumentParser(
        description="miles: RL post-training (PPO, GRPO, GSPO, REINFORCE++) for causal language models.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        defer_refused_flags=defer_refused_flags,
    )
    return get_miles_extra_args_provider(add_custom_arguments)(parser)


ARCHITECTURE_DESTS = (*ARCHITECTURE_FLAG_DESTS, *GROUPS_FLAGS)
_NOT_GIVEN = object()


def parse_args(add_custom_arguments=None, argv=None) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run ``miles_validate_args``.

    The ``--sglang-*`` words (SGLang's server arguments) are set aside as ``args.sglang_words``, and the
    ``--router-*`` words (sglang-router's) as ``args.router_words``, unparsed: the preflight checks them with SGLang's
    and sglang-router's own parsers (``miles.rollout.sglang_args``, ``miles.rollout.router``), so this imports
    neither."""
    argv, sglang_words = split_sglang_words(sys.argv[1:] if argv is None else list(argv))
    argv, router_words = split_router_words(argv)
    parser = build_parser(add_custom_arguments, defer_refused_flags=True)
    add_plugin_arguments(parser, argv)
    # argparse sets a default only on a namespace without the attribute: the marker tells a given flag from one
    # left at its default, so the preflight checks only the architecture flags the launch passed
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(ARCHITECTURE_DESTS, _NOT_GIVEN)))
    if (refusal := refused.refusal_line(args)) is not None:
        parser.error(refusal)  # exit 2, before any check reads a value and before Ray starts
    accepted = refused.accepted_lines(args)
    args.architecture_given = {}
    for dest in ARCHITECTURE_DESTS:
        if getattr(args, dest) is _NOT_GIVEN:
            setattr(args, dest, parser.get_default(dest))
        else:
            args.architecture_given[dest] = getattr(args, dest)
    args.sglang_words = sglang_words
    args.router_words = router_words  # sglang-router's options (--router-*): its own parser checks them
    # upstream's generate functions read it; --partial-rollout is refused (partial rollouts are not implemented yet)
    args.partial_rollout = False
    miles_validate_args(args)
    args.notes = [*accepted, *args.notes]  # said once at startup (configure_logging), with the corrections' note
    return args


def add_plugin_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Upstream's hook for a plug-in's own flags: the function ``--custom-generate-function-path`` names may carry
    ``add_arguments(parser)`` (``generate.add_arguments = ...``), which registers its flags before the launch is
    parsed, as upstream's ``add_user_provided_function_arguments`` does. A path that does not load adds nothing here:
    the preflight refuses it with its reason."""
    finder = argparse.ArgumentParser(add_help=False, exit_on_error=False)  # reads the one flag
    finder.add_argument("--custom-generate-function-path")
    try:
        path = finder.parse_known_args(argv)[0].custom_generate_function_path
    except argparse.ArgumentError:  # given without its value: the real parse reports it, once
        return
    if not path:
        return
    try:
        function = load_function("--custom-generate-function-path", path, "examples.custom_generate.generate.generate")
    except MilesConfigError:
        return
    if callable(getattr(function, "add_arguments", None)):
        function.add_arguments(parser)


def miles_validate_args(args) -> None:
    """Derive what upstream derives and enforce upstream's rules.

    Never rewrites a value the user set: derived values only fill flags left at ``None``, and each one is
    recorded in ``args.derived`` (``train()`` logs them once, after logging is configured), beside ``args.notes``:
    what the chosen combination of corrections means.
    """
    args.derived = []
    # use_critic first: the contract reads it, and miles-check reports the contract's verdict beside a range error
    _derive(args, "use_critic", args.advantage_estimator == "ppo", f"--advantage-estimator {args.advantage_estimator}")
    check_flag_values(args)  # before the rest: derived values must not be filled from a value out of range
    _fill(args, "eps_clip_high", args.eps_clip, "--eps-clip")
    _fill(args, "critic_lr", args.lr, "--lr")
    _fill(args, "critic_load", args.load, "--load")
    _fill(args, "critic_save", args.save, "--save")
    _fill(args, "critic_num_nodes", args.actor_num_nodes, "--actor-num-nodes")
    _fill(args, "critic_num_gpus_per_node", args.actor_num_gpus_per_node, "--actor-num-gpus-per-node")
    _fill(args, "n_samples_per_eval_prompt", args.n_samples_per_prompt, "--n-samples-per-prompt")
    _fill(args, "eval_temperature", args.rollout_temperature, "--rollout-temperature")
    _fill(args, "eval_max_response_len", args.rollout_max_response_len, "--rollout-max-response-len")
    _fill(args, "eval_top_p", args.rollout_top_p, "--rollout-top-p")
    _fill(args, "eval_top_k", args.rollout_top_k, "--rollout-top-k")
    _derive_batch_sizes(args)
    _check_dynamic_batch_size(args)
    _check_over_sampling(args)
    _derive_rollout_engines(args)
    _check_corrections(args)
    args.notes = [note] if (note := corrections.combination_note(args)) else []
    _check_kl(args)
    _check_estimator_requirements(args)
    _check_checkpointing(args)
    _check_rollout_backend(args)
    _check_router_address(args)
    check_rank_layout(args)
    apply_custom_config(args)
    # Last: it reads --num-rollout, which miles-check may not know. With --num-epoch, --num-rollout is derived from
    # the data, and the schedule is checked then (miles.ray.run).
    if args.num_epoch is None:
        check_lr_schedules(args)


def _derive(args, name: str, value, reason: str) -> None:
    setattr(args, name, value)
    args.derived.append(f"{name} = {value!r} ({reason})")


def _fill(args, name: str, value, source: str) -> None:
    if getattr(args, name) is None and value is not None:
        _derive(args, name, value, f"from {source}")


def _derive_batch_sizes(args) -> None:
    """global_batch_size * num_steps_per_rollout must equal the samples of one rollout (upstream's rule)."""
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.num_steps_per_rollout is None and args.global_batch_size is None:
        _derive(args, "num_steps_per_rollout", 1, "neither it nor --global-batch-size was given")
    if args.num_steps_per_rollout is not None:
        steps = args.num_steps_per_rollout
        if samples % steps:
            raise MilesConfigError(
                f"--num-steps-per-rollout {steps} does not divide the {samples} samples of a rollout "
                f"(--rollout-batch-size {args.rollout_batch_size} x --n-samples-per-prompt "
                f"{args.n_samples_per_prompt}). Pick a divisor of {samples}."
            )
        if args.global_batch_size is not None and args.global_batch_size != samples // steps:
            raise MilesConfigError(
                f"--global-batch-size {args.global_batch_size} contradicts --num-steps-per-rollout {steps}: a "
                f"rollout has {samples} samples, so {steps} steps take {samples // steps} samples each. Pass only "
                "one of the two."
            )
        _fill(args, "global_batch_size", samples // steps, "--num-steps-per-rollout")
        return
    if samples % args.global_batch_size:
        raise MilesConfigError(
            f"--global-batch-size {args.global_batch_size} does not divide the {samples} samples of a rollout "
            f"(--rollout-batch-size x --n-samples-per-prompt). Pick a divisor of {samples}."
        )
    _derive(args, "num_steps_per_rollout", samples // args.global_batch_size, "from --global-batch-size")


def _check_over_sampling(args) -> None:
    """--over-sampling-batch-size defaults to --rollout-batch-size and may not be below it (upstream's rule)."""
    _fill(args, "over_sampling_batch_size", args.rollout_batch_size, "--rollout-batch-size")
    sizes = (args.over_sampling_batch_size, args.rollout_batch_size)
    if all(isinstance(size, int) for size in sizes) and sizes[0] < sizes[1]:  # miles-check: placeholders pass
        raise MilesConfigError(
            f"--over-sampling-batch-size {args.over_sampling_batch_size} is below --rollout-batch-size "
            f"{args.rollout_batch_size}: a round must draw at least the prompts one rollout trains on. Pass at least "
            f"{args.rollout_batch_size}, or leave it out."
        )


def _derive_rollout_engines(args) -> None:
    """engines = --rollout-num-gpus / --rollout-num-gpus-per-engine (upstream's sizing); --rollout-num-engines is
    the same number under miles' name, so the two are filled from each other and must agree when both are given."""
    per_engine, gpus, engines = args.rollout_num_gpus_per_engine, args.rollout_num_gpus, args.rollout_num_engines
    if gpus is not None and gpus % per_engine:
        raise MilesConfigError(
            f"--rollout-num-gpus {gpus} is not a multiple of --rollout-num-gpus-per-engine {per_engine}, so the "
            f"engines would not use every GPU. Pass a multiple of {per_engine}."
        )
    if gpus is not None and engines is not None and engines != gpus // per_engine:
        raise MilesConfigError(
            f"--rollout-num-engines {engines} contradicts --rollout-num-gpus {gpus} / --rollout-num-gpus-per-engine "
            f"{per_engine} = {gpus // per_engine} engines. Pass only one of --rollout-num-engines and "
            "--rollout-num-gpus."
        )
    if engines is None:
        _derive(args, "rollout_num_engines", 1 if gpus is None else gpus // per_engine,
                "neither it nor --rollout-num-gpus was given" if gpus is None
                else "--rollout-num-gpus / --rollout-num-gpus-per-engine")
    _fill(args, "rollout_num_gpus", args.rollout_num_engines * per_engine,
          "--rollout-num-engines x --rollout-num-gpus-per-engine")


def _check_corrections(args) -> None:
    corrections.in_effect(args)  # refuses rows that exclude each other
    if args.tis_clip <= args.tis_clip_low:
        raise MilesConfigError(
            f"--tis-clip-low {args.tis_clip_low} and --tis-clip {args.tis_clip} must satisfy "
            "0 <= --tis-clip-low < --tis-clip. Pass e.g. --tis-clip-low 0 --tis-clip 2."
        )
    _check_tis_choices(args)


TIS_HOOK_EXAMPLES = "miles.backends.training_utils.loss_hub.corrections"  # the built-in hooks' module

TIS_CHOICE_DEFAULTS = {"tis_mode": "clip", "tis_level": "token", "rs_level": None, "rs_lower_bound": None,
                       "rs_upper_bound": None, "rs_veto_threshold": None}


def _check_tis_choices(args) -> None:
    """The TIS variants act only under --use-tis, one way at a time: a choice that would do nothing is refused."""
    chosen = [flag_name(dest) for dest, default in TIS_CHOICE_DEFAULTS.items() if getattr(args, dest) != default]
    hook = args.custom_tis_function_path
    if not args.use_tis and (chosen or hook is not None):
        named = chosen + (["--custom-tis-function-path"] if hook is not None else [])
        raise MilesConfigError(
            f"{', '.join(named)} set without --use-tis, but these choose how --use-tis re-weights the loss and do "
            "nothing without it. Add --use-tis, or drop them (docs/corrections.md)."
        )
    if hook is not None and chosen:
        raise MilesConfigError(
            f"--custom-tis-function-path {hook} replaces the built-in TIS, so {', '.join(chosen)} would be ignored. "
            "Drop them, or drop --custom-tis-function-path to use the built-in."
        )
    if args.tis_mode == "truncate" and args.tis_clip_low > 0:
        raise MilesConfigError(
            f"--tis-mode truncate has no lower bound, but --tis-clip-low is {args.tis_clip_low}. Use --tis-mode clip "
            "to bound the weight on both sides, or drop --tis-clip-low."
        )
    if args.rs_level is None and (args.rs_lower_bound is not None or args.rs_upper_bound is not None):
        raise MilesConfigError("--rs-lower-bound/--rs-upper-bound are set without --rs-level, which they bound. "
                               "Add e.g. --rs-level geometric, or drop them.")
    low = args.tis_clip_low if args.rs_lower_bound is None else args.rs_lower_bound
    high = args.tis_clip if args.rs_upper_bound is None else args.rs_upper_bound
    if args.rs_level is not None and not low < high:
        raise MilesConfigError(
            f"the --rs-level band [{low}, {high}] (--rs-lower-bound, --rs-upper-bound, default --tis-clip-low and "
            "--tis-clip) is empty or a point. Pass e.g. --rs-lower-bound 0.99 --rs-upper-bound 1.01."
        )
    if hook is not None:  # a bad path fails here, before anything starts
        load_function("--custom-tis-function-path", hook, f"{TIS_HOOK_EXAMPLES}.icepop_function")


def apply_custom_config(args) -> None:
    """--custom-config-path FILE.yaml: each key of the file's mapping becomes an attribute of ``args`` (upstream's
    rule), for custom functions to read (e.g. a TIS hook's ``tis_batch_normalize``).

    Applied after miles' checks of the command line, so a key may not change what miles already decided: a key
    naming an attribute ``args`` has (a flag, or a value miles derived) must equal it, except the built-in TIS's
    own settings (``TIS_CHOICE_DEFAULTS``) under --custom-tis-function-path, which replaces the built-in: there they
    configure the hook, as in upstream's examples."""
    path = args.custom_config_path
    if path is None:
        return
    import yaml

    try:
        with open(path) as file:
            data = yaml.safe_load(file) or {}
    except OSError as error:
        raise MilesConfigError(f"--custom-config-path {path} cannot be read ({error.strerror}). Pass an existing "
                               "YAML file of name: value lines.") from None
    except yaml.YAMLError as error:
        raise MilesConfigError(f"--custom-config-path {path} is not valid YAML ({' '.join(str(error).split())}). "
                               "Pass a YAML file of name: value lines.") from None
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise MilesConfigError(f"--custom-config-path {path} holds a {type(data).__name__}, but it must be a mapping "
                               "of names to values (name: value lines).")
    hook_settings = set(TIS_CHOICE_DEFAULTS) if args.custom_tis_function_path is not None else set()
    for key, value in data.items():
        if hasattr(args, key) and key not in hook_settings and getattr(args, key) != value:
            raise MilesConfigError(
                f"--custom-config-path {path} sets {key}: {value!r}, but the command line makes it {getattr(args, key)!r} "
                f"and the file may only add settings for custom functions. Pass {flag_name(key)} on the command line."
            )
    for key, value in data.items():
        setattr(args, key, value)
        args.derived.append(f"{key} = {value!r} (from --custom-config-path)")


def _check_dynamic_batch_size(args) -> None:
    """--use-dynamic-batch-size needs its budget (upstream's rule); the budgets mean nothing without it, so they are
    refused rather than ignored; the log-prob budget defaults to the training one (upstream's derivation)."""
    if not args.use_dynamic_batch_size:
        for dest in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu"):
            if getattr(args, dest) is not None:
                raise MilesConfigError(
                    f"--{dest.replace('_', '-')} {getattr(args, dest)} is given without --use-dynamic-batch-size, "
                    "and only dynamic batching reads a token budget (the fixed micro-batches take "
                    "--micro-batch-size samples). Add --use-dynamic-batch-size, or drop the budget."
                )
        return
    if args.max_tokens_per_gpu is None:
        raise MilesConfigError(
            "--use-dynamic-batch-size cuts micro-batches by a token budget, but --max-tokens-per-gpu is not given "
            "(upstream's rule). Add --max-tokens-per-gpu N, e.g. the longest prompt + response a sample can have."
        )
    _fill(args, "log_probs_max_tokens_per_gpu", args.max_tokens_per_gpu, "--max-tokens-per-gpu")


def _check_kl(args) -> None:
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        raise MilesConfigError(
            f"--kl-coef {args.kl_coef} and --kl-loss-coef {args.kl_loss_coef} are both non-zero, but only one KL "
            "penalty may be active: the reward-shaping one (--kl-coef) or the loss term (--use-kl-loss "
            "--kl-loss-coef). Set the other to 0."
        )
    if args.kl_coef != 0 and args.advantage_estimator in ("grpo", "gspo"):
        raise MilesConfigError(
            f"--kl-coef is {args.kl_coef}, but --advantage-estimator {args.advantage_estimator} has no per-token "
            "reward to fold a KL penalty into. Use a KL loss instead: "
            f"--use-kl-loss --kl-loss-coef {args.kl_coef}."
        )
    if args.use_critic and args.kl_coef != 0:
        raise MilesConfigError(
            f"--kl-coef is {args.kl_coef}, but PPO requires --kl-coef 0 (upstream's rule). Use a KL loss instead: "
            f"--use-kl-loss --kl-loss-coef {args.kl_coef}."
        )


def _check_estimator_requirements(args) -> None:
    if args.advantage_estimator.startswith("reinforce_plus_plus") and not args.normalize_advantages:
        raise MilesConfigError(
            f"--advantage-estimator {args.advantage_estimator} requires --normalize-advantages (REINFORCE++ "
            "whitens its returns over the batch). Add --normalize-advantages."
        )


def _check_rollout_backend(args) -> None:
    words = getattr(args, "sglang_words", [])
    if words and args.rollout_backend != "sglang":
        raise MilesConfigError(
            f"{words[0]} is an SGLang server argument, but --rollout-backend is {args.rollout_backend!r}, whose "
            "engines would ignore it. Add --rollout-backend sglang, or drop the --sglang-* flags."
        )


def _check_router_address(args) -> None:
    if (args.sglang_router_ip is None) != (args.sglang_router_port is None):
        given = "--sglang-router-ip" if args.sglang_router_ip is not None else "--sglang-router-port"
        raise MilesConfigError(
            f"{given} is given alone: a running router is named by both --sglang-router-ip and --sglang-router-port; "
            "give both, or neither (miles then starts one on 127.0.0.1).")


def _check_checkpointing(args) -> None:
    if args.save_interval is not None and args.save is None:
        raise MilesConfigError(
            f"--save-interval {args.save_interval} is set without --save, so there is nowhere to save. Add "
            "--save FOLDER, or drop --save-interval."
        )
