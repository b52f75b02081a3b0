"""The async off-policy contract, the parser's rules and derived values, and the drivers' CLI behavior."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import train
import train_async
from miles.config.departures import load_refusals
from miles.config.refused import implemented_actions
from miles.utils.arguments import (
    build_parser,
    miles_validate_args,
    parse_args,
    validate_async_off_policy_correction,
)
from miles.utils.errors import AsyncOffPolicyCorrectionError, MilesConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
CORRECTION_FLAGS = ["use_rollout_logprobs", "use_tis", "keep_old_actor"]


def _make_async_ppo_args(**overrides) -> SimpleNamespace:
    defaults = dict(use_critic=True, use_rollout_logprobs=False, use_tis=False, keep_old_actor=False)
    defaults.update(overrides)
    return SimpleNamespace(**defaults)


class TestValidateAsyncOffPolicyCorrection:
    def test_ppo_without_correction_is_rejected(self):
        with pytest.raises(AssertionError, match="behavior-policy correction"):
            validate_async_off_policy_correction(_make_async_ppo_args())

    @pytest.mark.parametrize("flag", CORRECTION_FLAGS)
    def test_ppo_with_any_correction_passes(self, flag):
        validate_async_off_policy_correction(_make_async_ppo_args(**{flag: True}))

    def test_non_ppo_estimators_are_unaffected(self):
        validate_async_off_policy_correction(_make_async_ppo_args(use_critic=False))

    def test_error_is_a_config_error_and_names_each_correction_with_what_it_does(self):
        with pytest.raises(AsyncOffPolicyCorrectionError) as caught:
            validate_async_off_policy_correction(_make_async_ppo_args())
        assert isinstance(caught.value, MilesConfigError)
        message = str(caught.value)
        assert "--use-rollout-logprobs  the rollout engine's log-probs become the PPO ratio denominator" in message
        assert "--use-tis               truncated importance sampling" in message
        assert "--keep-old-actor        the denominator is recomputed with the weights the rollout engines" in message

    def test_reads_only_the_four_contract_attributes(self):
        # The factory has exactly four attributes; anything else read would raise AttributeError.
        validate_async_off_policy_correction(_make_async_ppo_args(keep_old_actor=True))
        with pytest.raises(AttributeError):
            validate_async_off_policy_correction(SimpleNamespace(use_critic=True))


class TestParserDrivenContract:
    """The real parser + miles_validate_args + the validator, on real argv."""

    def _check(self, argv):
        args = parse_args(argv=argv)
        validate_async_off_policy_correction(args)
        return args

    def test_bare_ppo_reaches_the_contract(self):
        with pytest.raises(AssertionError, match="behavior-policy correction"):
            self._check(["--advantage-estimator", "ppo"])

    @pytest.mark.parametrize("flag", ["--use-rollout-logprobs", "--use-tis", "--keep-old-actor"])
    def test_each_correction_flag_passes(self, flag):
        args = self._check(["--advantage-estimator", "ppo", flag])
        assert args.use_critic is True

    @pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
    def test_critic_free_estimators_pass_without_correction(self, estimator):
        args = self._check(["--advantage-estimator", estimator, "--normalize-advantages"])
        assert args.use_critic is False

    def test_defaults_alone_are_a_valid_launch(self):
        args = self._check([])
        assert args.advantage_estimator == "grpo"


class TestDerivedValues:
    def test_fills_only_unset_values_and_records_each(self):
        args = parse_args(argv=["--advantage-estimator", "ppo", "--lr", "1e-3", "--save", "/tmp/ckpt"])
        assert args.use_critic is True
        assert args.eps_clip_high == args.eps_clip == 0.2
        assert args.critic_lr == 1e-3
        assert args.critic_save == "/tmp/ckpt"
        assert args.critic_load is None
        assert args.num_steps_per_rollout == 1
        assert args.global_batch_size == 16 * 8
        derived = "\n".join(args.derived)
        for name in ["use_critic", "eps_clip_high", "critic_lr", "critic_save", "global_batch_size"]:
            assert name in derived

    def test_evaluation_samples_like_the_rollouts_unless_told_otherwise(self):
        args = parse_args(argv=["--n-samples-per-prompt", "4", "--rollout-temperature", "0.8"])
        assert (args.n_samples_per_eval_prompt, args.eval_temperature, args.eval_max_response_len) == (4, 0.8, 3)
        args = parse_args(argv=["--n-samples-per-eval-prompt", "1", "--eval-temperature", "0.5",
                                "--eval-max-response-len", "2", "--eval-top-p", "1.0", "--eval-top-k", "-1"])
        assert (args.n_samples_per_eval_prompt, args.eval_temperature, args.eval_max_response_len) == (1, 0.5, 2)

    def test_eval_top_p_and_top_k_default_to_the_rollouts(self):
        args = parse_args(argv=["--rollout-top-p", "0.9", "--rollout-top-k", "20"])
        assert (args.eval_top_p, args.eval_top_k) == (0.9, 20)
        args = parse_args(argv=["--rollout-top-p", "0.9", "--eval-top-p", "1.0", "--eval-top-k", "3"])
        assert (args.eval_top_p, args.eval_top_k) == (1.0, 3)

    @pytest.mark.parametrize(("flag", "value"), [("--rollout-top-p", "0"), ("--rollout-top-p", "1.5"),
                                                 ("--rollout-top-k", "-2"), ("--rollout-min-p", "1.5"),
                                                 ("--eval-top-p", "0")])
    def test_sampling_filters_out_of_range_are_refused(self, flag, value):
        with pytest.raises(MilesConfigError, match=f"{flag} is .*but it must be"):
            parse_args(argv=[flag, value])

    def test_user_values_are_never_rewritten(self):
        args = parse_args(argv=["--eps-clip-high", "0.28", "--critic-lr", "1e-5", "--global-batch-size", "32"])
        assert args.eps_clip_high == 0.28
        assert args.critic_lr == 1e-5
        assert args.global_batch_size == 32
        assert args.num_steps_per_rollout == 4
        assert not any(line.startswith(("eps_clip_high", "critic_lr", "global_batch_size")) for line in args.derived)

    def test_steps_per_rollout_derives_global_batch_size(self):
        args = parse_args(argv=["--num-steps-per-rollout", "2"])
        assert args.global_batch_size == 64

    def test_consistent_global_batch_size_and_steps_are_accepted(self):
        args = parse_args(argv=["--num-steps-per-rollout", "2", "--global-batch-size", "64"])
        assert (args.num_steps_per_rollout, args.global_batch_size) == (2, 64)


# Each rule: argv that breaks it, and words the message must contain (the value and the fix).
RULES = {
    "rollout logprobs excludes tis": (["--use-rollout-logprobs", "--use-tis"], ["exclude each other"]),
    "one kl penalty": (
        ["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages", "--kl-coef", "0.1",
         "--kl-loss-coef", "0.1"],
        ["0.1", "Set the other to 0"],
    ),
    "ppo requires kl-coef 0": (
        ["--advantage-estimator", "ppo", "--kl-coef", "0.05", "--keep-old-actor"],
        ["--kl-coef 0", "--use-kl-loss --kl-loss-coef 0.05"],
    ),
    "grpo has no reward-shaping kl": (["--kl-coef", "0.1"], ["--advantage-estimator grpo", "--use-kl-loss"]),
    "reinforce++ needs normalization": (
        ["--advantage-estimator", "reinforce_plus_plus"],
        ["requires --normalize-advantages"],
    ),
    "reinforce++ baseline needs normalization": (
        ["--advantage-estimator", "reinforce_plus_plus_baseline"],
        ["requires --normalize-advantages"],
    ),
    "save-interval needs save": (["--save-interval", "10"], ["--save-interval 10", "--save FOLDER"]),
    "dual clip above one": (["--eps-clip-c", "1.0"], ["--eps-clip-c is 1.0", "> 1"]),
    "global batch contradicts steps": (
        ["--num-steps-per-rollout", "2", "--global-batch-size", "32"],
        ["contradicts", "64 samples each"],
    ),
    "global batch divides the rollout": (["--global-batch-size", "48"], ["48", "divisor of 128"]),
    "steps divide the rollout": (["--num-steps-per-rollout", "3"], ["divisor of 128"]),
    "response budget of zero": (["--rollout-max-response-len", "0"], ["--rollout-max-response-len is 0"]),
    "update interval at least one": (["--update-weights-interval", "0"], ["--update-weights-interval is 0"]),
    "positive temperature": (["--rollout-temperature", "0"], ["--rollout-temperature is 0"]),
    "tis bounds ordered": (["--use-tis", "--tis-clip", "0.5", "--tis-clip-low", "1.0"], ["--tis-clip-low 1.0"]),
}


@pytest.mark.parametrize("argv, words", RULES.values(), ids=RULES.keys())
def test_each_rule_rejects_with_value_rule_and_fix(argv, words):
    with pytest.raises(MilesConfigError) as caught:
        parse_args(argv=argv)
    for word in words:
        assert word in str(caught.value)


def test_validation_raises_explicitly_not_through_assert():
    for path in ("miles/utils/arguments.py", "miles/config/arguments.py", "miles/config/corrections.py"):
        source = (REPO_ROOT / path).read_text()
        assert not any(line.strip().startswith("assert ") for line in source.splitlines()), path


class TestParser:
    def test_every_flag_is_kebab_case_with_help_and_a_default(self):
        parser = build_parser()
        for action in implemented_actions(parser):
            if action.dest == "help":
                continue
            long_flags = [opt for opt in action.option_strings if opt.startswith("--")]
            assert long_flags and all(opt == opt.lower() and "_" not in opt for opt in long_flags), action
            assert action.help, f"{action.option_strings} has no help"
        # Every flag's default runs the embedded default: parsing nothing succeeds and validates.
        miles_validate_args(parser.parse_args([]))

    def test_help_lists_the_departures_from_upstream(self, capsys):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--help"])
        out = capsys.readouterr().out
        assert "depart from upstream" in out
        assert "--lr (default): 0.0003 (upstream: 1e-06)" in out  # rendered from departures.toml
        assert "--no-use-tensorboard: turns off TensorBoard" in out

    def test_disable_grpo_std_normalization_has_upstreams_action_and_dest(self):
        # Upstream: store_false into grpo_std_normalization, so a custom function written for upstream reads it.
        assert parse_args(argv=[]).grpo_std_normalization is True
        args = parse_args(argv=["--disable-grpo-std-normalization"])
        assert args.grpo_std_normalization is False and not hasattr(args, "disable_grpo_std_normalization")

    def test_custom_arguments_hook(self):
        args = parse_args(lambda p: p.add_argument("--my-flag", type=int, default=7), argv=["--my-flag", "3"])
        assert args.my_flag == 3


class _ReachedAllocation(Exception):
    """Raised by whatever train() would call after validation."""


class TestValidatorRunsBeforeAnyAllocation:
    @pytest.fixture(autouse=True)
    def _fail_after_validation(self, monkeypatch):
        def reached(*_args, **_kwargs):
            raise _ReachedAllocation

        monkeypatch.setattr(train_async, "configure_logging", reached)
        monkeypatch.setattr(train, "configure_logging", reached)

    def test_async_ppo_without_correction_stops_before_logging_and_allocation(self):
        args = parse_args(argv=["--advantage-estimator", "ppo"])
        with pytest.raises(AsyncOffPolicyCorrectionError):
            asyncio.run(train_async.train(args))

    def test_async_colocation_is_checked_first_too(self):
        args = parse_args(argv=["--colocate"])
        with pytest.raises(MilesConfigError, match="--colocate"):
            asyncio.run(train_async.train(args))

    @pytest.mark.parametrize("flag", ["--use-rollout-logprobs", "--use-tis", "--keep-old-actor"])
    def test_a_valid_async_launch_goes_on_to_allocate(self, flag):
        args = parse_args(argv=["--advantage-estimator", "ppo", flag])
        with pytest.raises(_ReachedAllocation):
            asyncio.run(train_async.train(args))

    def test_sync_driver_does_not_apply_the_contract(self):
        args = parse_args(argv=["--advantage-estimator", "ppo"])
        with pytest.raises(_ReachedAllocation):
            train.train(args)


HEAVY_MODULES = ("torch", "ray", "transformers", "sglang", "megatron", "wandb")
# What the contract's check does not need, so a refused launch does not pay for it (docs/benchmarks.md): the event
# loop and logging come after the check, the departures table only with --help or a refused flag.
NOT_BEFORE_THE_CONTRACT = {"asyncio", "logging", "tomllib", "miles.config.departures"}


def _run_driver(*argv, optimize=False):
    command = [sys.executable, *(["-O"] if optimize else []), "-X", "importtime", "train_async.py", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)


def _imported_modules(importtime_stderr: str) -> set[str]:
    # -X importtime lines end with "| <indent>module.name"
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("optimize", [False, True], ids=["python", "python -O"])
def test_cli_rejects_async_ppo_cleanly_without_heavy_imports(optimize):
    result = _run_driver("--advantage-estimator", "ppo", optimize=optimize)
    assert result.returncode == 2
    assert "error: Async PPO training requires an explicit behavior-policy correction" in result.stderr
    assert "Traceback" not in result.stderr
    imported = _imported_modules(result.stderr)
    assert not {name for name in imported if name.split(".")[0] in HEAVY_MODULES}
    assert not imported & NOT_BEFORE_THE_CONTRACT


def test_cli_reports_other_config_errors_the_same_way():
    result = _run_driver("--save-interval", "5")
    assert result.returncode == 2
    assert "error: --save-interval 5 is set without --save" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_argparse_errors_keep_argparse_behavior():
    result = _run_driver("--advantage-estimator", "dpo")
    assert result.returncode == 2
    assert "invalid choice: 'dpo'" in result.stderr


@pytest.mark.parametrize(
    "flags, words",
    [(["--use-rollout-logprobs", "--keep-old-actor"], "snapshots only feed"),
     (["--use-tis", "--keep-old-actor"], "TIS corrects only the train/inference numeric mismatch"),
     (["--keep-old-actor"], None), (["--use-tis"], None), ([], None)],
)
def test_each_combination_of_corrections_is_explained_once(flags, words):
    from miles.utils.arguments import correction_combination_note

    note = correction_combination_note(parse_args(argv=["--advantage-estimator", "ppo", *flags]))
    assert note is None if words is None else words in note


class TestNothingOutsideTheCodeSwitchesTheContractOff:
    """No flag and no environment variable lets a user start async PPO without a correction (issue 12: only a
    benchmark, inside its own process, may switch the contract off)."""

    def test_use_critic_is_derived_not_a_flag(self):
        assert "use_critic" not in {action.dest for action in build_parser()._actions}

    @pytest.mark.parametrize("flag", [
        option for action in implemented_actions(build_parser()) if action.nargs == 0 and action.dest != "help"
        for option in action.option_strings
    ])
    def test_no_switch_flag_gives_async_ppo_without_a_correction(self, flag):
        try:
            args = parse_args(argv=["--advantage-estimator", "ppo", flag])
        except MilesConfigError:
            return  # rejected by another rule: no launch at all
        corrected = any(getattr(args, name) for name in CORRECTION_FLAGS)
        if not corrected:
            with pytest.raises(AsyncOffPolicyCorrectionError):
                validate_async_off_policy_correction(args)

    def test_no_refused_switch_starts_a_launch_and_the_accepted_ones_set_nothing(self, capsys):
        refusals = load_refusals()
        switches = [flag for flag, refusal in refusals.items() if refusal.nargs == 0]
        refused = [flag for flag in switches if not refusals[flag].accepts]
        accepted = [flag for flag in switches if refusals[flag].accepts]
        assert "--bf16" in refused and "--accumulate-allreduce-grads-in-fp32" in accepted
        with pytest.raises(SystemExit) as stopped:
            parse_args(argv=["--advantage-estimator", "ppo", *switches])
        assert stopped.value.code == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert ": error: upstream flags miles refuses: " in error
        assert all(f" {flag}" in error for flag in refused) and not any(f" {flag}," in error for flag in accepted)
        launched, plain = vars(parse_args(argv=accepted)), vars(parse_args(argv=[]))
        # an accepted group's switches are said once at startup (docs/conformance.md) and set nothing else
        assert all(note.startswith("accepted upstream flags ") for note in launched.pop("notes"))
        assert plain.pop("notes") == [] and launched == plain

    def test_what_runs_before_the_contract_never_reads_the_environment(self):
        # Every miles module `python train_async.py` has imported when the contract runs (found, not listed, so a
        # new import is covered): if none reads os.environ, no variable can change the contract's verdict.
        code = ("import sys, train_async\n"
                "for name, module in sorted(sys.modules.items()):\n"
                "    if (name == 'train_async' or name.startswith('miles')) and getattr(module, '__file__', None):\n"
                "        print(module.__file__)")
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=True)
        files = result.stdout.split()
        assert any(path.endswith(os.path.join("miles", "utils", "arguments.py")) for path in files)
        readers = [path for path in files if any(word in Path(path).read_text() for word in ("environ", "getenv"))]
        assert readers == []

    def test_a_hostile_environment_still_gets_the_contract_error(self):
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONOPTIMIZE": "2", "MILES_SKIP_CONTRACT": "1",
               "MILES_ALLOW_UNCORRECTED_ASYNC_PPO": "1", "MILES_USE_TIS": "1", "USE_TIS": "1",
               "MILES_CACHE_DIR": "/nonexistent", "RAY_ADDRESS": "127.0.0.1:1"}
        result = subprocess.run([sys.executable, "train_async.py", "--advantage-estimator", "ppo"], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=60, env=env)
        assert result.returncode == 2
        assert "error: Async PPO training requires an explicit behavior-policy correction" in result.stderr
