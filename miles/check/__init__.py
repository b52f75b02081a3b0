"""miles-check: find each train_async.py / train.py launch in shell scripts and say whether the driver would refuse it.

The async off-policy contract (docs/async_off_policy_contract.md) makes ``train_async.py`` refuse async PPO
that has no behavior-policy correction, so launch scripts written before it need one more flag. This checker
finds those scripts without starting anything (no Ray, no model, no file written, no command run):

    miles-check -- ARGS...          check ARGS as a train_async.py launch (add --sync: as a train.py launch)
    miles-check SCRIPT.sh [...]     check every train_async.py / train.py invocation in each script
    miles-check --format json ...   the same, as one JSON array with one object per launch (for CI jobs)

For each invocation it prints file:line and the driver, then one of three results. OK: the driver starts it as
far as the resolved words show, and no unresolved word could change the contract's verdict. REJECTED: the
driver refuses it whatever the unresolved words hold, with the exact error and a one-line fix. DEPENDS: the
contract's verdict (or a refusal) could change with a word miles-check could not resolve, and it names that
word. The arguments go through the real parser (``build_parser``), then ``miles_validate_args``; for
train_async.py then the colocation check and the contract, as in the driver. Each check runs even when an
earlier one failed (within one, the first broken rule is reported). The parser may not know a flag: upstream
launchers carry Megatron and SGLang options. Such flags are listed as ignored; the contract does not read them.
(miles' own drivers refuse unknown flags; the checker ignores them because it reads upstream-style launchers.)

Modules: ``shell`` reads shell text into words and values, ``script`` walks a script (assignments, ``source``,
launches), ``launch`` judges one argument list, ``cli`` prints and picks the exit status.

What the script reader resolves without running anything:
- continuation lines, quotes and comments; ``;``, ``&&`` and ``|`` lists, redirections, heredoc bodies (skipped);
- ``ray job submit ... -- python3 .../train_async.py``;
- variables and bash arrays assigned earlier: ``LR=1e-6``, ``export``, ``declare -a``, ``ARGS=( ... )``,
  ``ARGS+=( ... )``, used as ``$LR``, ``${LR}``, ``"${ARGS[@]}"``, ``${ARGS[*]}``, ``${ARGS[0]}``,
  ``${LR:-default}``, ``${LR-default}`` or ``${ARGS[@]+"${ARGS[@]}"}``;
- ``read [-r] NAME`` / ``read -ra NAME <<< WORD`` and ``mapfile``/``readarray [-t] NAME <<< WORD`` (from the
  here-string's words), and ``eval STRING`` (its string is read as commands once it resolves);
- ``$0`` and ``${BASH_SOURCE[0]}`` (the script's path), and the path idioms built from them:
  ``SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"``, ``$(dirname "$0")``,
  ``REPO_ROOT="$(cd -- "${SCRIPT_DIR}/../.." && pwd)"``, ``realpath``/``readlink -f`` of an absolute path;
- ``source FILE`` / ``. FILE`` when FILE resolves to an absolute path of a readable file (for example
  ``"${SCRIPT_DIR}/common.sh"``): read in place, its launches reported as FILE:LINE, at most
  ``MAX_SOURCE_DEPTH`` deep, a cycle refused;
- invocations inside ``if``/``for`` blocks and functions (each found invocation is checked).
``"$@"`` and ``$*`` (the script's own arguments) count as empty, so a script is checked as if it ran with no
arguments.

What it never guesses (the word is unresolved, and the report says why, naming the variable or the command):
- a variable that is not assigned in the file or a file it sources (the environment; a ``source`` it could
  not follow is named, with why);
- a variable assigned under a condition (in an ``if``/``case``/loop block or a function, or after ``&&`` /
  ``||``): conditions are not evaluated;
- what a ``read``/``mapfile``/``eval`` assignment gets from an unresolved word (a command's output: the report
  names the command);
- a positional parameter ``$1``; command substitution other than the path idioms, backticks, arithmetic and
  other ``${...}`` forms;
- Python launchers: a ``python`` command that names a driver without running it, or a driver started
  through ``bash -c`` or an unresolved ``eval``.

How unresolved words are judged (``launch``): a word right after a flag that takes a value, or after a flag
miles does not know, is that flag's value (as is ``--flag=$X``): the flag counts as set, so "--save-interval
without --save" holds; a rule that needs the value is a "cannot check" note. Two readings are assumed, not
known: an unquoted value is one value (bash would split it at spaces), and a flag miles does not know takes
the word after it (upstream's Megatron flags do). Any other unresolved word is in a flag position and could
add a flag when it may begin with ``-`` or stand for several words (an array, an unquoted expansion); a
variable assigned under a condition could add only the flags among the words it could hold. The contract's
verdict is determinate for train.py; for a launch with a resolved correction flag (words add flags, they
cannot remove one); and otherwise when the estimator is resolved and no word that could add a flag sits where
it would count (anywhere for ppo; after the last ``--advantage-estimator`` for a critic-free estimator). A
refusal by another rule stands only when no word could add a flag.

Exit status (``cli.EXIT_EPILOG``): 0 no launch REJECTED or DEPENDS; 1 a launch REJECTED (wins over 3); 3 a
launch DEPENDS, a launch miles-check cannot see into, or a script with no launch found; 2 a usage error (no
arguments, --sync with scripts, a file that cannot be read). Changed from the first version, which exited 1 on
any unresolved word: a CI job needs "refused", "depends" and "fine" apart, and a train.py launch whose
unresolved words cannot matter to the contract passes.

Limits (bash features it does not model):
- ``#`` in the middle of a word: shlex reads it as a comment;
- interpreter options that take a value (``python -X dev train.py``);
- ``"$@"`` inside a shell function: it is empty as well;
- ``source`` of a relative path (bash looks it up from the directory the script is started in): not read;
- assignments inside a ``( ... )`` subshell are read as if they persisted after it.
"""

from miles.check.cli import main
from miles.check.launch import CONTRACT_FIX, DEPENDS, OK, REJECTED, Verdict, check_launch
from miles.check.script import scan_script
from miles.check.shell import (
    Expansion,
    Unresolved,
    annotate_expansions,
    driver_position,
    logical_commands,
    path_command_output,
    resolve_words,
)

__all__ = [
    "CONTRACT_FIX", "DEPENDS", "OK", "REJECTED", "Expansion", "Unresolved", "Verdict", "annotate_expansions",
    "check_launch", "driver_position", "logical_commands", "main", "path_command_output", "resolve_words",
    "scan_script",
]
