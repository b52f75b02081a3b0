"""miles-check: the shell-script reader, the per-launch check and the CLI's output and exit codes."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from miles.check import (
    CONTRACT_FIX,
    Expansion,
    Unresolved,
    annotate_expansions,
    check_launch,
    driver_position,
    logical_commands,
    main,
    path_command_output,
    resolve_words,
    scan_script,
)
from miles.utils.arguments import ASYNC_PPO_CORRECTION_MESSAGE
from miles.config.arguments import build_parser
from miles.config.refused import refusal_line

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
            ("$FIX", "FIX is assigned under a condition at line 4, which miles-check does not evaluate (it holds "
                     "the words assigned there or the ones it had before)"),
            ("${ARGS[@]}", "ARGS is assigned under a condition at line 6, which miles-check does not evaluate (it "
                           "holds the words assigned there or the ones it had before)"),
        ]
        # what each could hold: FIX came from the environment before (anything); ARGS, an array, was empty
        assert first.args[0].could_hold[0] == "" and first.args[0].could_hold[1].could_hold is None
        assert first.args[1].could_hold == ("--use-tis",)
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


class TestScriptFolderIdioms:
    SCRIPT = "/repo/scripts/run/launch.sh"
    VARIABLES = {"0": [SCRIPT], "BASH_SOURCE": [SCRIPT], "SCRIPT_DIR": ["/repo/scripts/run"]}

    @pytest.mark.parametrize(
        "command, output",
        [('cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd', "/repo/scripts/run"),
         ('cd "$(dirname "$0")" && pwd', "/repo/scripts/run"),
         ('dirname "$0"', "/repo/scripts/run"),
         ('cd -- "${SCRIPT_DIR}/../.." >/dev/null 2>&1 && pwd', "/repo"),
         ('basename "$0" .sh', "launch.sh")],
    )
    def test_path_idioms_give_the_folder_the_path_text_names(self, command, output):
        assert path_command_output(command, self.VARIABLES) == output

    @pytest.mark.parametrize(
        "command",
        ["date +%Y%m%d_%H%M%S", "cd scripts && pwd", "pwd", 'cd "$UNSET_DIR" && pwd', 'cd /x || pwd',
         "git rev-parse --show-toplevel"],
    )
    def test_anything_else_is_not_evaluated(self, command):
        assert path_command_output(command, self.VARIABLES) is None

    def test_script_dir_resolves_from_the_script_path_and_stays_unresolved_without_it(self):
        text = ('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
                'python3 "${SCRIPT_DIR}/train.py" --save "${SCRIPT_DIR}/ckpt" --seed "$(basename "$0")"\n')
        (invocation,) = scan_script(text, "/repo/scripts/launch.sh").invocations
        assert invocation.args == ["--save", "/repo/scripts/ckpt", "--seed", "launch.sh"]
        (invocation,) = scan_script(text).invocations
        assert isinstance(invocation.args[1], Unresolved) and "runs no commands" in invocation.args[1].reason


class TestReadMapfileEval:
    def test_read_a_from_a_resolved_here_string_splits_it_into_elements(self):
        text = 'LINE="--num-layers 36 --swiglu"\nread -ra MODEL <<< "$LINE"\npython3 train.py "${MODEL[@]}"\n'
        assert _only_invocation(text).args == ["--num-layers", "36", "--swiglu"]

    def test_read_a_from_a_command_says_what_really_happened(self):
        text = ('MODEL_ARGS_LINE="$(python3 tools/model_args.py qwen3-4B)" || exit 1\n'
                'read -ra MODEL_ARGS <<< "${MODEL_ARGS_LINE}"\npython3 train.py "${MODEL_ARGS[@]}"\n')
        (word,) = _only_invocation(text).args
        assert word.text == "${MODEL_ARGS[@]}" and word.several
        assert word.reason == ("MODEL_ARGS is assigned at line 2 by `read -ra` from ${MODEL_ARGS_LINE}: "
                               "MODEL_ARGS_LINE=$(python3 tools/model_args.py qwen3-4B): command substitution: "
                               "miles-check runs no commands")

    def test_mapfile_takes_one_element_per_line_and_names_a_process_substitution(self):
        text = ('LINES="--seed\n1"\nmapfile -t A <<< "$LINES"\nreadarray B < <(./list.sh --all)\n'
                'python3 train.py "${A[@]}" "${B[@]}"\n')
        seed, one, rest = _only_invocation(text.replace("\\n", "\n")).args
        assert (seed, one) == ("--seed", "1")
        assert rest.reason.startswith("B is assigned at line 4 by `readarray` from <(./list.sh --all): a process")

    def test_eval_of_an_array_assignment(self):
        resolved = 'L="--seed 3"\neval "A=(${L})"\npython3 train.py "${A[@]}"\n'
        assert _only_invocation(resolved).args == ["--seed", "3"]
        (word,) = _only_invocation('eval "A=(${HELPER_OUT})"\npython3 train.py "${A[@]}"\n').args
        assert word.several and word.reason.startswith('A is assigned at line 1 by eval of "A=(${HELPER_OUT})": '
                                                       "HELPER_OUT is not assigned")

    def test_a_resolved_eval_string_is_read_as_commands(self):
        invocation = _only_invocation('CMD="python3 train.py --seed 4"\n\neval "$CMD"\n')
        assert (invocation.line, invocation.args) == (3, ["--seed", "4"])


    def test_a_process_substitution_as_output_is_no_argument(self):
        invocation = _only_invocation("python3 train.py --seed 1 2> >(tee err.log) --lr 1\n")
        assert invocation.args == ["--seed", "1", "--lr", "1"]

    def test_bare_builtins_and_a_sourced_process_substitution_do_not_break_the_walk(self):
        text = ('read\nmapfile\neval\nsource\neval "$(conda shell.bash hook)"\nsource <(echo B=1)\n'
                "python3 train.py $B\n")
        (word,) = _only_invocation(text).args
        assert "<(...), sourced at line 6 and not read (a process substitution" in word.reason


class TestSource:
    def _write(self, folder, name, text):
        path = folder / name
        path.write_text(text)
        return path

    def test_a_sourced_file_assigns_and_its_launch_is_reported_in_that_file(self, tmp_path):
        self._write(tmp_path, "common.sh", 'HERE="$(dirname "${BASH_SOURCE[0]}")"\nBASE=(--seed 5)\n'
                                           'python3 train.py --num-rollout 1\n')
        script = self._write(tmp_path, "run.sh", 'D="$(cd "$(dirname "$0")" && pwd)"\nsource "$D/common.sh"\n'
                                                 'python3 train.py "${BASE[@]}" --save "$HERE"\n')
        scan = scan_script(script.read_text(), str(script))
        assert [(i.file, i.line, i.args) for i in scan.invocations] == [
            (str(tmp_path / "common.sh"), 3, ["--num-rollout", "1"]),
            (None, 3, ["--seed", "5", "--save", str(tmp_path)]),
        ]

    def test_a_source_it_cannot_follow_is_named_where_a_variable_may_come_from(self, tmp_path):
        text = "source env/common.sh\n. /no/such/file.sh\npython3 train.py --lr $LR\n"
        (word,) = _only_invocation(text).args[1:]
        assert ("env/common.sh, sourced at line 1 and not read (a relative path, which bash looks up from the "
                "directory the script is started in)") in word.reason
        assert "/no/such/file.sh, sourced at line 2 and not read (no such file)" in word.reason

    def test_a_source_cycle_and_deep_nesting_stop(self, tmp_path):
        self._write(tmp_path, "a.sh", f'source "{tmp_path}/b.sh"\nA=1\n')
        self._write(tmp_path, "b.sh", f'source "{tmp_path}/a.sh"\nB=1\n')
        script = self._write(tmp_path, "run.sh", f'source "{tmp_path}/a.sh"\npython3 train.py --seed $A$B\n')
        assert scan_script(script.read_text(), str(script)).invocations[0].args == ["--seed", "11"]
        for depth in range(12):  # d0.sh sources d1.sh ... sources d11.sh, which sets DEEP
            self._write(tmp_path, f"d{depth}.sh", f'source "{tmp_path}/d{depth + 1}.sh"\n')
        self._write(tmp_path, "d12.sh", "DEEP=1\n")
        deep = f'source "{tmp_path}/d0.sh"\npython3 train.py --seed $DEEP\n'
        (word,) = scan_script(deep, str(script)).invocations[0].args[1:]
        assert "sourced files nest deeper than 8" in word.reason


class TestCheckLaunch:
    def test_a_correction_passes_the_contract_whatever_the_unresolved_estimator_is(self):
        verdict = check_launch(["--advantage-estimator", Unresolved("$EST", "EST from env"), "--keep-old-actor"])
        assert verdict.status == "OK"
        assert verdict.unresolved == [("--advantage-estimator $EST", "EST from env")]
        assert verdict.contract == "contract: OK (--keep-old-actor, whatever --advantage-estimator $EST is)"
        # deriving use_critic reads the estimator: a note, never an error computed from the default
        assert verdict.errors == [] and "reads --advantage-estimator" in verdict.cannot_check[0]

    def test_an_unresolved_estimator_without_a_correction_depends_on_it(self):
        verdict = check_launch(["--advantage-estimator", Unresolved("$EST", "EST from env")])
        assert verdict.status == "DEPENDS"
        assert verdict.depends_on[0][0] == "--advantage-estimator $EST"

    def test_unresolved_word_after_a_switch_keeps_the_switch(self):
        verdict = check_launch(["--advantage-estimator", "ppo", "--keep-old-actor", Unresolved("$X", "r")])
        assert verdict.unresolved == [("$X", "r")]
        assert verdict.errors == []
        # a word can add flags, not remove one: the correction holds whatever $X is
        assert (verdict.status, verdict.contract) == ("OK", "contract: OK (--keep-old-actor)")

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
        verdict = check_launch(["--my-parallel-size", "2", "--my-switch", "--use-tis",
                                "--my-std", "-0.02", "--advantage-estimator", "ppo"])
        assert verdict.status == "OK"
        assert verdict.ignored == ["--my-parallel-size 2", "--my-switch", "--my-std -0.02"]

    def test_unknown_flags_are_listed_when_another_argument_does_not_parse(self):
        # argparse stops at the invalid choice before it gathers the unknown flags; they are still named
        verdict = check_launch(["--my-parallel-size", "2", "--train-backend", "fsdp", "--my-switch", "--use-tis",
                                "--my-std", "-0.02", "--lr=1e-6", "--my-rate=3"], "train.py", strict=True)
        assert verdict.status == "REJECTED" and "invalid choice: 'fsdp'" in verdict.errors[0][0]
        assert verdict.ignored == ["--my-parallel-size 2", "--my-switch", "--my-std -0.02", "--my-rate=3"]

    def test_refused_upstream_flags_are_the_drivers_error_counted_only_under_strict(self):
        words = ["--context-parallel-size", "2", "--use-opd", "--use-tis", "--init-method-std", "-0.02",
                 "--context-parallel-size", "1", "--advantage-estimator", "ppo"]
        verdict = check_launch(words)
        assert verdict.status == "OK" and not verdict.refusals_counted and verdict.ignored == []
        (message, fix), = verdict.errors
        assert message == f"train_async.py: error: {refusal_line(build_parser().parse_args(words))}"
        assert "--context-parallel-size 2:" in message and "; --use-opd:" in message
        assert "--init-method-std -0.02:" in message
        assert fix.startswith("fix: drop the refused flags")
        assert check_launch(words, strict=True).status == "REJECTED"

    def test_an_accepted_value_of_a_refused_flag_is_no_error(self):
        verdict = check_launch(["--context-parallel-size", "1", "--attention-dropout", "0.0", "--use-tis",
                                "--accumulate-allreduce-grads-in-fp32", "--advantage-estimator", "ppo"], strict=True)
        assert verdict.status == "OK" and verdict.errors == [] and verdict.ignored == []


class TestUnresolvedWords:
    """Which unresolved words can change a verdict: decided by where they sit, never by guessing their value."""

    TS = Unresolved("/ckpt/run_${TS}", "TS=$(date): command substitution")
    ARRAY = Unresolved("${MODEL_ARGS[@]}", "from a helper", several=True)

    def test_a_flag_with_an_unresolved_value_is_set(self):
        for driver in ("train.py", "train_async.py"):
            verdict = check_launch(["--save", self.TS, "--save-interval", "20"], driver)
            assert (verdict.status, verdict.errors, verdict.cannot_check) == ("OK", [], [])
            assert verdict.unresolved == [("--save /ckpt/run_${TS}", "TS=$(date): command substitution")]

    def test_an_unresolved_numeric_value_does_not_stop_the_other_rules(self):
        verdict = check_launch(["--num-rollout", Unresolved("${N}", "N from env"), "--save-interval", "20"], "train.py")
        assert [error for error, _ in verdict.errors] == [
            "--save-interval 20 is set without --save, so there is nowhere to save. Add --save FOLDER, or drop "
            "--save-interval."]

    def test_a_rule_that_needs_the_value_is_a_note_not_an_error(self):
        verdict = check_launch(["--save-interval", Unresolved("${N}", "N from env")], "train.py")
        assert verdict.status == "OK" and verdict.errors == []
        assert verdict.cannot_check == ["cannot check: a rule in miles_validate_args reads --save-interval, whose "
                                        "value ${N} is unresolved (that check's later rules are not checked)"]

    @pytest.mark.parametrize("form", ["after the flag", "--flag=word"])
    def test_a_refused_flag_with_an_unresolved_value_is_refused_whatever_it_holds(self, form):
        # upstream's LoRA launchers pass --target-modules ${LORA_TARGET_MODULES:-all-linear}: no value is accepted
        text = "${LORA_TARGET_MODULES:-all-linear}"
        words = (["--target-modules", Unresolved(text, "from env")] if form == "after the flag"
                 else [Unresolved(f"--target-modules={text}", "from env")])
        verdict = check_launch(["--use-tis", *words, "--advantage-estimator", "ppo"])
        assert verdict.status == "OK" and not verdict.refusals_counted and verdict.cannot_check == []
        (message, fix), = verdict.errors
        assert f"--target-modules {text}: " in message and fix.startswith("fix: drop the refused flags")
        assert check_launch(["--use-tis", *words, "--advantage-estimator", "ppo"], strict=True).status == "REJECTED"

    def test_a_refused_flag_whose_unresolved_value_could_be_accepted_is_a_note(self):
        verdict = check_launch(["--context-parallel-size", Unresolved("${CP}", "CP from env"),
                                "--advantage-estimator", "grpo"], strict=True)
        assert (verdict.status, verdict.errors) == ("OK", [])
        assert verdict.cannot_check == ["cannot check: --context-parallel-size ${CP} is refused unless it is 1, and "
                                        "its value is unresolved"]

    def test_equals_form_and_a_later_resolved_flag(self):
        verdict = check_launch(["--advantage-estimator", "ppo",
                                Unresolved("--save=${DIR}", "r"), "--save-interval", "2"])
        assert verdict.status == "REJECTED" and len(verdict.errors) == 1  # the contract only
        later = check_launch(["--advantage-estimator", Unresolved("$E", "r"), "--advantage-estimator", "grpo"])
        assert later.status == "OK" and later.contract.startswith("contract: exempt")

    def test_async_ppo_whose_unresolved_words_are_all_values_is_rejected(self):
        verdict = check_launch(["--advantage-estimator", "ppo", "--save", self.TS, "--tensor-model-parallel-size",
                                Unresolved("${TP}", "TP from env", unquoted=True)])
        assert verdict.status == "REJECTED" and verdict.depends_on == []
        assert verdict.contract == "contract: REJECTED (async PPO without a behavior-policy correction)"

    @pytest.mark.parametrize("word", [ARRAY, Unresolved("$EXTRA", "r", unquoted=True), Unresolved("${FLAG}", "r"),
                                      Unresolved("/data/${X}", "r", unquoted=True)])
    def test_async_ppo_with_a_word_that_could_add_a_flag_depends_on_it(self, word):
        verdict = check_launch(["--advantage-estimator", "ppo", "--num-rollout", "2", word])
        assert verdict.status == "DEPENDS"
        assert verdict.depends_on == [(word.text, "in a flag position, it could add a correction flag or "
                                                  "--advantage-estimator")]

    def test_a_switch_given_a_value_is_no_value(self):
        verdict = check_launch(["--advantage-estimator", "ppo", Unresolved("--use-tis=${X}", "r")])
        assert verdict.status == "DEPENDS" and verdict.depends_on[0][0] == "--use-tis=${X}"

    def test_a_quoted_word_that_cannot_begin_with_a_dash_adds_no_flag(self):
        verdict = check_launch(["--advantage-estimator", "ppo", Unresolved("/data/${X}", "r")])
        assert verdict.status == "REJECTED"

    def test_a_critic_free_estimator_depends_only_on_words_after_it(self):
        before = check_launch([self.ARRAY, "--advantage-estimator", "grpo"])
        assert before.status == "OK" and before.contract.startswith("contract: exempt")
        after = check_launch(["--advantage-estimator", "grpo", self.ARRAY])
        assert after.status == "DEPENDS" and after.depends_on[0][1].startswith(
            "in a flag position, it could add --advantage-estimator ppo after the last --advantage-estimator")
        default = check_launch([self.ARRAY])  # grpo by default: any such word could set ppo
        assert default.status == "DEPENDS"

    def test_train_py_never_depends_on_unresolved_words(self):
        verdict = check_launch(["--advantage-estimator", "ppo", self.ARRAY, Unresolved("$X", "r")], "train.py")
        assert verdict.status == "OK" and verdict.depends_on == []

    def test_a_conditional_array_is_judged_by_the_words_it_could_hold(self):
        wandb = Unresolved("${WANDB_ARGS[@]}", "cond", several=True, could_hold=("--use-wandb", "--wandb-key",
                                                                               Unresolved("${KEY}", "env")))
        assert check_launch(["--advantage-estimator", "ppo", wandb]).status == "REJECTED"
        fix = Unresolved("${FIX[@]}", "cond", several=True, could_hold=("--use-tis",))
        verdict = check_launch(["--advantage-estimator", "ppo", fix])
        assert verdict.status == "DEPENDS"
        assert verdict.depends_on == [("${FIX[@]}", "in a flag position, it could add --use-tis")]

    def test_a_contract_refusal_stands_when_the_words_could_add_only_other_flags(self):
        interval = Unresolved("${CKPT[@]}", "cond", several=True, could_hold=("--save-interval", "5"))
        verdict = check_launch(["--advantage-estimator", "ppo", interval])
        assert (verdict.status, verdict.depends_on) == ("REJECTED", [])

    def test_with_strict_another_rule_refuses_only_when_no_word_could_lift_it(self):
        assert check_launch(["--colocate"], strict=True).status == "REJECTED"
        verdict = check_launch(["--colocate", "--advantage-estimator", "ppo", "--use-tis", self.ARRAY], strict=True)
        assert verdict.status == "DEPENDS"
        assert verdict.depends_on == [("${MODEL_ARGS[@]}", "in a flag position, it could add any flag, which could "
                                                           "lift the refusal")]
        verdict = check_launch(["--colocate", "--advantage-estimator", "grpo", Unresolved("${X}", "r")], "train.py")
        assert verdict.status == "OK"  # train.py accepts --colocate: nothing to lift
        # a train.py launch never depends on unresolved words: strict, the refusal stands; by default it is a note
        args = ["--save-interval", "2", "--advantage-estimator", "grpo", self.ARRAY]
        verdict = check_launch(args, "train.py", strict=True)
        assert (verdict.status, verdict.depends_on, verdict.refusals_counted) == ("REJECTED", [], True)
        verdict = check_launch(args, "train.py")
        assert (verdict.status, verdict.depends_on, verdict.refusals_counted) == ("OK", [], False)
        assert "--save-interval" in verdict.errors[0][0]

    def test_by_default_only_the_contract_counts(self):
        verdict = check_launch(["--colocate", "--advantage-estimator", "grpo"])  # miles refuses async colocation
        assert (verdict.status, verdict.refusals_counted) == ("OK", False) and verdict.errors
        verdict = check_launch(["--colocate", "--advantage-estimator", "ppo"])  # the contract refuses it too
        assert verdict.status == "REJECTED" and CONTRACT_FIX in [fix for _, fix in verdict.errors]
        verdict = check_launch(["--colocate", "--advantage-estimator", "grpo", self.ARRAY])
        assert verdict.status == "DEPENDS"  # the array could set ppo: the contract's verdict is open
        assert [word for word, _ in verdict.depends_on] == ["${MODEL_ARGS[@]}"]
        verdict = check_launch(["--advantage-estimator", "grpo", "--train-backend", "nope"])
        assert verdict.status == "REJECTED"  # the arguments do not parse: the contract cannot be read
        verdict = check_launch(["--advantage-estimator", "grpo", "--train-backend", "nope"], "train.py")
        assert verdict.status == "OK" and "invalid choice" in verdict.errors[0][0]


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

    def test_opsm_alone_is_rejected_with_the_contract_error_and_its_reason(self, capsys):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", "--use-opsm", "--opsm-delta", "1e-4"])
        assert status == 1
        assert out.splitlines()[0] == ("command line: train_async.py: REJECTED; contract: REJECTED (async PPO "
                                       "without a behavior-policy correction; --use-opsm is not one: its "
                                       "denominator is the current actor's)")
        assert f"  error: {CONTRACT_FIRST_LINE}" in out and f"  {CONTRACT_FIX}" in out

    @pytest.mark.parametrize("extra", [
        ["--custom-tis-function-path", "miles.backends.training_utils.loss_hub.corrections.icepop_function"],
        ["--custom-tis-function-path", "miles.backends.training_utils.loss_hub.corrections.vanilla_tis_function"],
        ["--tis-mode", "mask", "--tis-level", "geometric", "--tis-clip-low", "0.99", "--tis-clip", "1.01"],
        ["--rs-level", "geometric", "--rs-lower-bound", "0.99", "--rs-upper-bound", "1.01", "--rs-veto-threshold",
         "1e-4", "--use-opsm"],
    ])
    def test_upstream_tis_variants_pass_with_use_tis(self, capsys, extra):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", "--use-tis", *extra])
        assert status == 0 and out == "command line: train_async.py: OK; contract: OK (--use-tis)\n"

    @pytest.mark.parametrize("backend", [["--train-backend", "torch"], []])
    def test_a_sync_launch_miles_cannot_run_exits_0_and_with_strict_1_with_the_reason(self, capsys, backend):
        args = ["--advantage-estimator", "grpo", "--tensor-model-parallel-size", "2",
                "--pipeline-model-parallel-size", "2", *backend]
        status, out, _ = _run(capsys, ["--sync", "--", *args])
        assert status == 0 and "train.py: OK; contract: not applicable" in out and "note: miles would refuse" in out
        status, out, _ = _run(capsys, ["--strict", "--sync", "--", *args])
        assert status == 1 and "train.py: REJECTED" in out and "pipeline" in out.lower()

    def test_a_tis_variant_without_use_tis_is_a_note_and_with_strict_a_refusal(self, capsys):
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "grpo", "--tis-mode", "mask"])
        assert status == 0 and "--tis-mode set without --use-tis" in out
        assert "note: miles would refuse this launch for a reason other than the contract" in out
        status, out, _ = _run(capsys, ["--strict", "--", "--advantage-estimator", "grpo", "--tis-mode", "mask"])
        assert status == 1 and "--tis-mode set without --use-tis" in out and "note:" not in out

    def test_unknown_and_sglang_flags_are_ignored_and_the_verdict_stands(self, capsys):
        unknown = ["--my-parallel-size", "2", "--sglang-mem-fraction-static", "0.7"]
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", *unknown])
        assert status == 1 and CONTRACT_FIX in out
        assert "the contract does not read them): --my-parallel-size 2\n" in out
        assert "the contract does not read them): --sglang-mem-fraction-static 0.7\n" in out
        status, out, _ = _run(capsys, ["--", "--advantage-estimator", "ppo", "--use-tis", *unknown])
        assert status == 0 and "--my-parallel-size 2" in out and "--sglang-mem-fraction-static 0.7" in out

    def test_a_refused_upstream_flag_is_a_note_and_with_strict_a_refusal(self, capsys):
        words = ["--", "--advantage-estimator", "ppo", "--use-tis", "--context-parallel-size", "2"]
        status, out, _ = _run(capsys, words)
        assert status == 0 and "note: miles would refuse this launch" in out
        assert "error: upstream flags miles refuses: --context-parallel-size 2: miles' megatron backend" in out
        status, out, _ = _run(capsys, ["--strict", *words])
        assert status == 1 and "upstream flags miles refuses: --context-parallel-size 2" in out

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
        assert "--sglang-mem-fraction-static 0.7" in out
        assert "--sequence-parallel" not in out  # implemented: neither refused nor ignored
        assert out.rstrip().endswith("1 REJECTED")

    def test_the_same_launcher_with_a_correction_passes(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "megatron_async_ppo_keep_old_actor.sh"])
        assert status == 0
        assert "train_async.py: OK; contract: OK (--keep-old-actor)" in out
        assert "--sequence-parallel" not in out  # implemented: neither refused nor ignored
        # a range error is a note beside the contract's verdict (a tensor-parallel engine: --rollout-num-gpus-per-engine 2)
        assert "error: --rollout-num-gpus-per-engine is 2, but it must be >= 1 and <= 1" in out

    def test_ray_job_submit_launcher_passes(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "ray_job_submit_tis.sh"])
        assert status == 0 and "ray_job_submit_tis.sh:23: train_async.py: OK; contract: OK (--use-tis)" in out

    def test_environment_variables_are_unresolved_named_and_the_verdict_depends(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "env_var_unresolved.sh"])
        assert status == 3
        assert "env_var_unresolved.sh:6: train_async.py: DEPENDS" in out
        assert "depends on ${CORRECTION_FLAG}: in a flag position, it could add a correction flag" in out
        assert "unresolved (not guessed): --lr ${LR}: LR is not assigned" in out
        assert "unresolved (not guessed): ${CORRECTION_FLAG}: CORRECTION_FLAG is not assigned" in out
        assert CONTRACT_FIX in out  # the resolved words alone lack a correction

    def test_python_launcher_depends_on_what_it_passes(self, capsys):
        status, out, _ = _run(capsys, [FIXTURES / "python_launcher.sh"])
        assert status == 3 and "python_launcher.sh:4: DEPENDS" in out and "Python launcher" in out

    def test_script_without_invocation_is_not_ok(self, capsys, tmp_path):
        script = tmp_path / "prepare.sh"
        script.write_text("set -e\npython3 tools/convert_hf.py --out /ckpt\n")
        status, out, _ = _run(capsys, [script])
        assert status == 3
        assert "no train_async.py / train.py invocation found" in out
        assert "python command seen, not a driver: line 2: python3 tools/convert_hf.py --out /ckpt" in out

    def test_one_rejected_script_among_good_ones_fails_the_run(self, capsys):
        scripts = [FIXTURES / "ray_job_submit_tis.sh", FIXTURES / "megatron_async_ppo_uncorrected.sh"]
        status, out, _ = _run(capsys, scripts)
        assert status == 1
        assert out.splitlines()[-1] == "miles-check: 2 result(s) in 2 file(s): 1 OK, 1 REJECTED"


class TestUpstreamStyleLaunchers:
    """Launchers in the style of upstream's scripts (helper-generated MODEL_ARGS, SCRIPT_DIR, a timestamped
    --save, a conditional W&B block, environment defaults, `source`): the verdict a CI job can trust."""

    @pytest.mark.parametrize(
        "name, status, header",
        [("upstream_sync_ppo.sh", 0, "upstream_sync_ppo.sh:35: train.py: OK; contract: not applicable"),
         ("upstream_async_grpo.sh", 0, "upstream_async_grpo.sh:28: train_async.py: OK; contract: exempt"),
         ("upstream_async_ppo_uncorrected.sh", 1,
          "upstream_async_ppo_uncorrected.sh:26: train_async.py: REJECTED; contract: REJECTED"),
         ("upstream_async_ppo_helper_args.sh", 3, "upstream_async_ppo_helper_args.sh:11: train_async.py: DEPENDS")],
    )
    def test_each_launcher_gets_the_verdict_its_words_decide(self, capsys, name, status, header):
        code, out, _ = _run(capsys, [FIXTURES / name])
        assert code == status, out
        assert header in out
        assert "error: --save-interval" not in out  # --save is set, to a value miles-check does not know

    def test_the_helper_array_is_named_with_what_really_happened(self, capsys):
        _, out, _ = _run(capsys, [FIXTURES / "upstream_async_ppo_helper_args.sh"])
        assert ("depends on ${MODEL_ARGS[@]}: in a flag position, it could add a correction flag or "
                "--advantage-estimator") in out
        assert ("MODEL_ARGS is assigned at line 9 by `read -ra` from ${MODEL_ARGS_LINE}: MODEL_ARGS_LINE=$(python3 "
                '"${SCRIPT_DIR}/model_args_utils.py" qwen3-4B): command substitution') in out

    def test_the_sourced_model_file_is_read(self, capsys):
        _, out, _ = _run(capsys, [FIXTURES / "upstream_async_ppo_uncorrected.sh"])
        # its flags are miles' (checked against the checkpoint by the driver's preflight): neither ignored nor refused
        assert "MODEL_ARGS is not assigned" not in out and "ignored" not in out and "miles refuses" not in out

    def test_rejected_wins_over_depends_and_json_has_one_object_per_launch(self, capsys):
        names = ["upstream_sync_ppo.sh", "upstream_async_ppo_helper_args.sh", "upstream_async_ppo_uncorrected.sh"]
        status, out, _ = _run(capsys, ["--format", "json", *(FIXTURES / name for name in names)])
        assert status == 1
        records = json.loads(out)
        assert [(Path(r["file"]).name, r["driver"], r["verdict"], r["exit_class"], r["exit_status"])
                for r in records] == [
            ("upstream_sync_ppo.sh", "train.py", "OK", "ok", 0),
            ("upstream_async_ppo_helper_args.sh", "train_async.py", "DEPENDS", "depends", 3),
            ("upstream_async_ppo_uncorrected.sh", "train_async.py", "REJECTED", "rejected", 1),
        ]
        depends = records[1]
        assert depends["depends_on"][0]["word"] == "${MODEL_ARGS[@]}" and depends["line"] == 11
        assert depends["unresolved"][0]["reason"].startswith("MODEL_ARGS is assigned at line 9 by `read -ra`")
        assert records[2]["errors"][0]["fix"] == CONTRACT_FIX
        assert len(records[2]["errors"]) == 1 and records[2]["ignored"] == []  # the model file's flags are miles'
        assert set(records[0]) == {"file", "line", "driver", "verdict", "exit_class", "exit_status", "contract",
                                   "depends_on", "unresolved", "cannot_check", "errors", "ignored", "sglang_words",
                                   "router_words", "errors_counted"}

    def test_sglang_and_router_flags_are_listed_as_passed_on_not_as_unknown(self, capsys):
        argv = ["--advantage-estimator", "ppo", "--use-tis", "--rollout-backend", "sglang",
                "--sglang-mem-fraction-static", "0.7", "--no-sglang-lora-use-virtual-experts", "--my-num-layers", "36",
                "--router-policy", "random"]
        status, out, _ = _run(capsys, ["--format", "json", "--", *argv])
        record = json.loads(out)[0]
        assert status == 0 and record["verdict"] == "OK"
        assert record["sglang_words"] == ["--sglang-mem-fraction-static 0.7", "--no-sglang-lora-use-virtual-experts"]
        assert record["router_words"] == ["--router-policy random"]
        assert record["ignored"] == ["--my-num-layers 36"]
        status, out, _ = _run(capsys, ["--", *argv])
        assert "SGLang server arguments" in out and "--sglang-mem-fraction-static 0.7" in out
        assert "sglang-router options" in out and "--router-policy random" in out
        assert "ignored (unknown to the miles parser; the contract does not read them): --my-num-layers 36" in out

    def test_json_for_one_argument_list_and_a_launcher_it_cannot_see_into(self, capsys):
        status, out, _ = _run(capsys, ["--format", "json", "--", "--advantage-estimator", "ppo", "--use-tis"])
        assert status == 0 and json.loads(out)[0]["contract"] == "contract: OK (--use-tis)"
        status, out, _ = _run(capsys, ["--format", "json", FIXTURES / "python_launcher.sh"])
        (record,) = json.loads(out)
        assert status == 3 and record["driver"] is None and "Python launcher" in record["depends_on"][0]["why"]

    def test_help_documents_the_exit_statuses(self, capsys):
        status, out, _ = _run(capsys, ["--help"])
        assert status == 0
        flat = " ".join(out.split())
        assert "Exit status: 0 no launch is refused" in flat and "1 a launch is REJECTED" in flat
        assert "3 a launch DEPENDS on unresolved words" in flat and "2 usage error" in flat


def test_examples_pass_miles_check_as_a_subprocess():
    assert [path.name for path in EXAMPLES] == [
        "async_grpo.sh", "async_ppo_keep_old_actor.sh", "async_ppo_megatron.sh", "async_ppo_rollout_logprobs.sh",
        "async_ppo_tis.sh", "custom_generate.sh", "sync_ppo.sh", "upstream_shaped_launch.sh",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "miles.check", *map(str, EXAMPLES)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": OK; contract: ") == 8
    assert result.stdout.splitlines()[-1] == "miles-check: 8 result(s) in 8 file(s): 8 OK"


def test_checking_imports_no_heavy_library():
    code = ("import sys, miles.check as c; c.main(['--', '--advantage-estimator', 'ppo']); "
            "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr
