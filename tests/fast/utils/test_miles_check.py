"""miles-check: the shell-script reader, the per-launch check and the CLI's output and exit codes."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from miles.utils.arguments import ASYNC_PPO_CORRECTION_MESSAGE
from miles.utils.check import (
    CONTRACT_FIX,
    Expansion,
    Unresolved,
    annotate_expansions,
    check_launch,
    driver_position,
    logical_commands,
    main,
    resolve_words,
    scan_script,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "miles_check"
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.sh"))
CONTRACT_FIRST_LINE = ASYNC_PPO_CORRECTION_MESSAGE.splitlines()[0]


def _run(capsys, argv) -> tuple:
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _only_invocation(text: str):
    scan = scan_script(text)
    assert len(scan.invocations) == 1, scan
    return scan.invocations[0]


def _resolve(word: str, variables: dict, split: bool = True) -> list:
    annotated, expansions = annotate_expansions(word)
    (raw,) = shlex.split(annotated)  # one shell word, its quotes removed, as the script reader hands it over
    return resolve_words(raw, expansions, variables, split=split)


class TestLogicalCommands:
    def test_continuation_lines_join_and_keep_the_first_line_number(self):
        text = "set -e\npython train.py \\\n  --lr 1 \\\n  --seed 2\necho done\n"
        assert logical_commands(text) == [
            (1, "set -e", ""),
            (2, "python train.py   --lr 1   --seed 2", ""),
            (5, "echo done", ""),
        ]

    def test_multi_line_array_and_quote_stay_one_command(self):
        text = 'A=(\n  --x 1  # a comment with a ) and a \'\n  --y\n)\nJSON="{\n  \\"a\\": 1\n}"\nnext'
        commands = logical_commands(text)
        assert [line for line, _, _ in commands] == [1, 5, 8]
        assert commands[0][1].endswith("--y\n)")

    def test_heredoc_body_is_skipped_not_read_as_commands(self):
        text = "python3 - <<EOF\nimport os\nprint('unbalanced (')\nEOF\npython train.py --seed 1\n"
        commands = logical_commands(text)
        assert commands == [(1, "python3 - <<EOF", "import os\nprint('unbalanced (')"),
                            (5, "python train.py --seed 1", "")]

    def test_quoted_double_less_than_is_not_a_heredoc(self):
        text = 'echo "a << b"\npython train.py --seed 1\nb\n'
        assert [line for line, _, _ in logical_commands(text)] == [1, 2, 3]

    def test_backslash_at_the_end_of_a_comment_does_not_join_the_next_line(self):
        # bash ends a comment at the newline; the next line is a command of its own
        text = "# old flags: --use-tis \\\npython train_async.py --advantage-estimator ppo\n"
        assert [line for line, _, _ in logical_commands(text)] == [1, 2]


class TestAnnotateExpansions:
    def test_records_double_quoted_and_bare_expansions_but_not_single_quoted_or_escaped(self):
        annotated, expansions = annotate_expansions("""a "$X" ${Y[@]} '$Z' \\$W""")
        assert expansions == [Expansion("$X", quoted=True), Expansion("${Y[@]}", quoted=False)]
        assert annotated == """a "\x000\x00" \x001\x00 '$Z' \\$W"""

    def test_comments_are_left_alone(self):
        _, expansions = annotate_expansions("--lr 1  # --wandb-key ${WANDB_KEY}")
        assert expansions == []

    def test_command_substitution_is_one_expansion(self):
        _, expansions = annotate_expansions('D="$(cd "$(dirname x)" && pwd)"')
        assert expansions == [Expansion('$(cd "$(dirname x)" && pwd)', quoted=True)]

    def test_fd_digits_of_a_redirection_are_dropped(self):
        annotated, _ = annotate_expansions("python train.py --num-rollout 2 2>&1")
        assert annotated == "python train.py --num-rollout 2 >&1"


class TestResolveWords:
    ARRAY = {"A": ["--x", "a b"], "V": ["1 2"], "EMPTY": [""]}

    def test_quoted_array_gives_one_word_per_element(self):
        assert _resolve('"${A[@]}"', self.ARRAY) == ["--x", "a b"]

    def test_unquoted_array_and_scalar_are_word_split(self):
        assert _resolve("${A[@]}", self.ARRAY) == ["--x", "a", "b"]
        assert _resolve("$V", self.ARRAY) == ["1", "2"]

    def test_quoted_scalar_stays_one_word_and_star_joins(self):
        assert _resolve('"$V"', self.ARRAY) == ["1 2"]
        assert _resolve('"${A[*]}"', self.ARRAY) == ["--x a b"]

    def test_empty_values_vanish_unquoted_and_stay_quoted(self):
        assert _resolve("$EMPTY", self.ARRAY) == []
        assert _resolve('"$EMPTY"', self.ARRAY) == [""]

    def test_expansion_inside_a_word(self):
        assert _resolve("--lr=${V}e-6", self.ARRAY) == ["--lr=1 2e-6"]
        assert _resolve("${A[1]}", self.ARRAY) == ["a", "b"]

    def test_script_arguments_are_empty(self):
        assert _resolve('"$@"', {}) == []
        assert _resolve("$*", {}) == []

    def test_unassigned_variable_is_unresolved_and_named(self):
        (word,) = _resolve('"${LR}"', {})
        assert isinstance(word, Unresolved)
        assert word.text == "${LR}"
        assert "LR is not assigned" in word.reason and "environment" in word.reason

    def test_default_form_resolves_only_from_the_script(self):
        (word,) = _resolve("${LR:-1e-6}", {})
        assert isinstance(word, Unresolved) and "'1e-6' when unset" in word.reason
        assert _resolve("${LR:-1e-6}", {"LR": [""]}) == ["1e-6"]
        assert _resolve("${LR:-1e-6}", {"LR": ["3e-4"]}) == ["3e-4"]

    def test_colon_forms_treat_empty_as_unset_and_plain_forms_do_not(self):
        variables = {"EMPTY": [""], "SET": ["v"]}
        assert _resolve('"${EMPTY-d}"', variables) == [""]
        assert _resolve("${EMPTY:-d}", variables) == ["d"]
        assert _resolve("${EMPTY+alt}", variables) == ["alt"]
        assert _resolve("${EMPTY:+alt}", variables) == []
        assert _resolve("${SET:+alt}", variables) == ["alt"]

    def test_set_u_safe_array_idiom(self):
        # ${A[@]+"${A[@]}"}: the elements when the array has any, nothing when it is empty
        assert _resolve('${A[@]+"${A[@]}"}', {"A": ["--x", "a b"]}) == ["--x", "a b"]
        assert _resolve('${A[@]+"${A[@]}"}', {"A": []}) == []
        (word,) = _resolve('${A[@]+"${A[@]}"}', {})
        assert isinstance(word, Unresolved) and "A is not assigned" in word.reason

    @pytest.mark.parametrize(
        "word, reason",
        [("$1", "positional parameter"), ("$(pwd)", "command substitution"), ("`pwd`", "command substitution"),
         ("$((1 + 2))", "arithmetic"), ("${#A[@]}", "not evaluated")],
    )
    def test_what_needs_running_is_unresolved(self, word, reason):
        (resolved,) = _resolve(word, self.ARRAY)
        assert isinstance(resolved, Unresolved) and reason in resolved.reason

    def test_unresolved_inside_a_word_makes_the_whole_word_unresolved(self):
        (word,) = _resolve("--save=/ckpt/${RUN}", {})
        assert isinstance(word, Unresolved) and word.text == "--save=/ckpt/${RUN}"

    def test_assignment_value_is_not_split(self):
        assert _resolve("$V", self.ARRAY, split=False) == ["1 2"]


class TestDriverPosition:
    @pytest.mark.parametrize(
        "words, expected",
        [
            (["python", "train.py", "--lr", "1"], 1),
            (["python3", "-u", "/root/miles/train_async.py"], 2),
            (["./train_async.py", "--seed", "1"], 0),
            (["ray", "job", "submit", "--address=x", "--", "python3", "train_async.py"], 6),
            ([Unresolved("$PYTHON", "env"), "train.py"], 1),
            (["cp", "train.py", "backup/"], None),
            (["python3", "tools/convert.py", "--out", "train.py"], None),
            (["echo", "python train.py"], None),
        ],
    )
    def test_only_a_python_command_running_the_driver_counts(self, words, expected):
        assert driver_position(words) == expected


class TestScanScript:
    def test_arrays_variables_comments_and_quotes(self):
        text = (
            'LR=1e-6\nexport SEED=7\ndeclare -a BASE=(--num-rollout 20)\nBASE+=(\n  --rollout-batch-size 4  # four\n'
            '  # --use-tis\n)\nEXTRA=("--save" "/tmp/a b")\n'
            'python3 train_async.py "${BASE[@]}" --lr $LR --seed "${SEED}" "${EXTRA[@]}" "$@"\n'
        )
        invocation = _only_invocation(text)
        assert invocation.line == 9 and invocation.driver == "train_async.py"
        assert invocation.args == ["--num-rollout", "20", "--rollout-batch-size", "4", "--lr", "1e-6",
                                   "--seed", "7", "--save", "/tmp/a b"]
        assert invocation.uses_script_arguments

    def test_assignments_apply_in_order_even_on_one_line(self):
        invocation = _only_invocation("LR=1; LR=2; python train.py --lr $LR; LR=3\n")
        assert invocation.args == ["--lr", "2"]

    def test_assignments_under_a_condition_are_unresolved_until_assigned_again(self):
        text = (
            'if [ "$MODE" = safe ]; then\n  FIX=--keep-old-actor\nelse\n  FIX=\nfi\n'
            '[ -n "${X:-}" ] && ARGS+=(--use-tis)\n'
            'python3 train_async.py $FIX "${ARGS[@]}"\n'
            'FIX=--use-tis\npython3 train_async.py $FIX\n'
        )
        first, second = scan_script(text).invocations
        assert [(word.text, word.reason) for word in first.args] == [
            ("$FIX", "FIX is assigned under a condition at line 4, which miles-check does not evaluate"),
            ("${ARGS[@]}", "ARGS is assigned under a condition at line 6, which miles-check does not evaluate"),
        ]
        assert second.args == ["--use-tis"]

    def test_invocation_inside_a_function_is_found(self):
        invocation = _only_invocation('run() {\n  python3 train.py --seed 3 "$@"\n}\nrun --lr 1\n')
        assert invocation.args == ["--seed", "3"] and invocation.uses_script_arguments

    def test_command_prefix_assignment_does_not_set_a_shell_variable(self):
        text = "LR=5 true\npython train.py --lr $LR\n"
        (word,) = _only_invocation(text).args[1:]
        assert isinstance(word, Unresolved)

    def test_pipes_redirections_and_lists_end_the_arguments(self):
        text = "cd /x && python train.py --seed 1 > log.txt 2>&1 | tee -a all.log; echo done\n"
        assert _only_invocation(text).args == ["--seed", "1"]

    def test_ray_job_submit_with_a_multi_line_json_environment(self):
        invocation = _only_invocation((FIXTURES / "ray_job_submit_tis.sh").read_text())
        assert invocation.driver == "train_async.py"
        assert invocation.args[:4] == ["--actor-num-nodes", "1", "--advantage-estimator", "ppo"]
        assert "--use-tis" in invocation.args

    def test_python_launcher_and_shell_strings_are_unresolved_findings(self):
        scan = scan_script('python3 launch.py --driver train_async.py\nbash -c "python train.py --lr 1"\n'
                           "python3 tools/convert.py --in a --out b\n")
        assert scan.invocations == []
        assert [finding.line for finding in scan.launchers] == [1, 2]
        assert "Python launcher" in scan.launchers[0].reason and "`bash`" in scan.launchers[1].reason
        assert scan.python_commands == ["line 1: python3 launch.py --driver train_async.py",
                                        "line 3: python3 tools/convert.py --in a --out b"]


class TestCheckLaunch:
    def test_unresolved_value_of_a_known_flag_leaves_the_flag_at_its_default(self):
        verdict = check_launch(["--advantage-estimator", Unresolved("$EST", "EST from env"), "--keep-old-actor"])
        assert verdict.status == "UNRESOLVED"
        assert verdict.unresolved == ["--advantage-estimator $EST: EST from env"]
        # grpo is the default: the verdict of the resolved words says so, and says what it rests on
        assert verdict.contract.startswith("contract, from the resolved words alone: exempt")

    def test_unresolved_word_after_a_switch_keeps_the_switch(self):
        verdict = check_launch(["--advantage-estimator", "ppo", "--keep-old-actor", Unresolved("$X", "r")])
        assert verdict.unresolved == ["$X: r"]
        assert verdict.errors == []
        assert verdict.contract == "contract, from the resolved words alone: OK (--keep-old-actor)"

    def test_every_failing_check_is_reported_with_its_fix(self):
        verdict = check_launch(["--advantage-estimator", "ppo", "--colocate", "--save-interval", "5"])
        assert verdict.status == "REJECTED"
        messages = [message for message, _ in verdict.errors]
        assert messages[0].startswith("--save-interval 5 is set without --save")
        assert messages[1].startswith("--colocate is set")
        assert messages[2] == ASYNC_PPO_CORRECTION_MESSAGE
        assert [fix for _, fix in verdict.errors] == [
            "fix: add --save FOLDER, or drop --save-interval.",
            "fix: drop --colocate, or train synchronously with train.py --colocate.",
            CONTRACT_FIX,
        ]

    def test_train_py_is_not_held_to_the_contract(self):
        verdict = check_launch(["--advantage-estimator", "ppo", "--colocate"], "train.py")
        assert (verdict.status, verdict.errors) == ("OK", [])
        assert "not applicable" in verdict.contract

    def test_unknown_flags_are_grouped_with_their_values(self):
        verdict = check_launch(["--context-parallel-size", "2", "--sequence-parallel", "--use-tis",
                                "--adam-eps", "-1e-8", "--advantage-estimator", "ppo"])
        assert verdict.status == "OK"
        assert verdict.ignored == ["--context-parallel-size 2", "--sequence-parallel", "--adam-eps -1e-8"]


class TestMainArgumentList:
    def test_async_ppo_without_correction_is_rejected_with_the_exact_error_and_the_fix(self, capsys):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo"])
        assert status == 1
        assert out.splitlines()[0] == ("command line: train_async.py: REJECTED; contract: REJECTED (async PPO "
                                       "without a behavior-policy correction)")
        assert f"  error: {CONTRACT_FIRST_LINE}" in out
        assert f"  {CONTRACT_FIX}" in out

    @pytest.mark.parametrize("flag", ["--use-rollout-logprobs", "--use-tis", "--keep-old-actor"])
    def test_each_correction_passes(self, capsys, flag):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", flag])
        assert status == 0
        assert out == f"command line: train_async.py: OK; contract: OK ({flag})\n"

    def test_unknown_megatron_and_sglang_flags_are_ignored_and_the_verdict_stands(self, capsys):
        unknown = ["--context-parallel-size", "2", "--sglang-mem-fraction-static", "0.7"]
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", *unknown])
        assert status == 1 and CONTRACT_FIX in out
        assert "--context-parallel-size 2, --sglang-mem-fraction-static 0.7" in out
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", "--use-tis", *unknown])
        assert status == 0 and "--context-parallel-size 2, --sglang-mem-fraction-static 0.7" in out

    def test_grpo_is_exempt_and_sync_checks_as_train_py(self, capsys):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "grpo"])
        assert status == 0 and "contract: exempt" in out
        status, out, _ = _run(capsys, ["--sync", "--", "--advantage-estimator", "ppo"])
        assert status == 0 and out.startswith("command line: train.py: OK")

    def test_a_value_the_parser_refuses_is_rejected_with_argparse_message(self, capsys):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo2"])
        assert status == 1
        assert "error: train_async.py: error: argument --advantage-estimator: invalid choice: 'ppo2'" in out

    def test_empty_argument_list_checks_the_defaults(self, capsys):
        status, out, _ = _run(capsys, ["--"])
        assert status == 0 and "contract: exempt (--advantage-estimator grpo" in out

    @pytest.mark.parametrize(
        "argv, message",
        [([], "give `-- ARGS...`"), (["--sync", "a.sh"], "--sync applies to"),
         (["a.sh", "--", "--seed", "1"], "not both"), (["/no/such/script.sh"], "cannot read /no/such/script.sh")],
    )
    def test_usage_errors_exit_2(self, capsys, argv, message):
        status, out, err = _run(capsys, argv)
        assert status == 2 and out == ""
        assert message in err


class TestMainScripts:
    def test_uncorrected_megatron_launcher_is_rejected_with_the_fix(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "megatron_async_ppo_uncorrected.sh"])
        assert status == 1
        assert "megatron_async_ppo_uncorrected.sh:65: train_async.py: REJECTED" in out
        assert CONTRACT_FIRST_LINE in out and CONTRACT_FIX in out
        assert "--sequence-parallel" in out and "--sglang-mem-fraction-static 0.7" in out
        assert out.rstrip().endswith("1 REJECTED")

    def test_the_same_launcher_with_a_correction_passes(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "megatron_async_ppo_keep_old_actor.sh"])
        assert status == 0
        assert "train_async.py: OK; contract: OK (--keep-old-actor)" in out
        assert "--sequence-parallel" in out

    def test_ray_job_submit_launcher_passes(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "ray_job_submit_tis.sh"])
        assert status == 0 and "ray_job_submit_tis.sh:23: train_async.py: OK; contract: OK (--use-tis)" in out

    def test_environment_variables_are_unresolved_named_and_not_ok(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "env_var_unresolved.sh"])
        assert status == 1
        assert "env_var_unresolved.sh:6: train_async.py: UNRESOLVED" in out
        assert "unresolved (not guessed): --lr ${LR}: LR is not assigned" in out
        assert "unresolved (not guessed): ${CORRECTION_FLAG}: CORRECTION_FLAG is not assigned" in out
        assert CONTRACT_FIX in out  # the resolved words alone lack a correction

    def test_python_launcher_is_unresolved(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "python_launcher.sh"])
        assert status == 1 and "python_launcher.sh:4: UNRESOLVED" in out and "Python launcher" in out

    def test_script_without_invocation_is_not_ok(self, capsys, tmp_path):
        script = tmp_path / "prepare.sh"
        script.write_text("set -e\npython3 tools/convert_hf.py --out /ckpt\n")
        status, out, _ = _run(capsys, [script])
        assert status == 1
        assert "no train_async.py / train.py invocation found" in out
        assert "python command seen, not a driver: line 2: python3 tools/convert_hf.py --out /ckpt" in out

    def test_one_rejected_script_among_good_ones_fails_the_run(self, capsys):
        scripts = [FIXTURES / "ray_job_submit_tis.sh", FIXTURES / "megatron_async_ppo_uncorrected.sh"]
        status, out, _ = _run(capsys, scripts)
        assert status == 1
        assert out.splitlines()[-1] == "miles-check: 2 result(s) in 2 file(s): 1 OK, 1 REJECTED"


def test_examples_pass_miles_check_as_a_subprocess():
    assert [path.name for path in EXAMPLES] == [
        "async_grpo.sh", "async_ppo_keep_old_actor.sh", "async_ppo_rollout_logprobs.sh", "async_ppo_tis.sh",
        "sync_ppo.sh",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "miles.utils.check", *map(str, EXAMPLES)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": OK; contract: ") == 5
    assert result.stdout.splitlines()[-1] == "miles-check: 5 result(s) in 5 file(s): 5 OK"


def test_checking_imports_no_heavy_library():
    code = ("import sys, miles.utils.check as c; c.main(['--', '--advantage-estimator', 'ppo']); "
            "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr
