"""Bad input through the real CLI, and the one check that can only act once the run has started (a prompt file
too large to tokenize up front). The checks themselves are tested in tests/fast/utils/test_preflight.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import train
from miles.tracking.metrics import read_metrics
from miles.ray import preflight
from miles.utils.cli import _user_message
from miles.utils.errors import MilesConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_prompt_in_a_file_too_large_to_check_up_front_stops_the_run_when_first_generated(
    make_args, tmp_path, monkeypatch
):
    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_PROMPTS", 0)  # as if the file held millions of prompts
    data = tmp_path / "prompts.jsonl"
    prompts = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5=", "6+6=", "é+1=", "7+7="]  # the bad one is in rollout 1
    data.write_text("".join(json.dumps({"prompt": prompt, "label": "0"}) + "\n" for prompt in prompts))
    args = make_args("--prompt-data", str(data), "--num-rollout", "3")
    with pytest.raises(MilesConfigError) as caught:
        train.train(args)
    message = str(_user_message(caught.value, MilesConfigError))  # what run_cli prints after "error: "
    assert message.startswith("prompt 'é+1=' has characters that are not in the vocabulary"), message
    assert [record["rollout_id"] for record in read_metrics(args.log_dir)] == [0]  # rollout 0 trained


def test_cli_refuses_a_bad_path_in_one_line_before_ray_starts_and_writes_nothing(embedded_cache, tmp_path):
    cwd = tmp_path / "cwd"  # the default --log-dir is runs/... under it: it must stay empty
    cwd.mkdir()
    command = [sys.executable, str(REPO_ROOT / "train.py"), "--hf-checkpoint", embedded_cache.checkpoint_dir,
               "--prompt-data", embedded_cache.train_jsonl, "--load", str(tmp_path / "typo")]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --load ") and "does not exist" in errors[0]
    assert "Traceback" not in result.stderr and "Ray" not in result.stderr  # ray.init() never ran
    assert list(cwd.iterdir()) == [] and not (tmp_path / "typo").exists()
