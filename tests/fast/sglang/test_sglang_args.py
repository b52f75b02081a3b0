"""--sglang-* flags: set aside by the parser without importing SGLang, checked by SGLang's own parser in the
preflight, and the settings miles owns refused with value, rule and fix."""

import subprocess
import sys

import pytest

from miles.config.sglang_words import split_sglang_words
from miles.rollout import sglang_args
from miles.rollout.sglang_args import check_owned, engine_kwargs
from miles.utils.arguments import parse_args
from miles.utils.errors import MilesConfigError


def test_sglang_words_are_set_aside_with_their_values():
    argv = ["--lr", "1", "--sglang-max-total-tokens", "4096", "--sglang-enable-deterministic-inference",
            "--num-rollout", "2", "--sglang-dtype=bfloat16", "--sglang-log-level", "--seed", "3"]
    rest, words = split_sglang_words(argv)
    assert rest == ["--lr", "1", "--num-rollout", "2", "--seed", "3"]
    assert words == ["--sglang-max-total-tokens", "4096", "--sglang-enable-deterministic-inference",
                     "--sglang-dtype=bfloat16", "--sglang-log-level"]
    assert split_sglang_words(["--sglang-", "x"]) == (["--sglang-", "x"], [])


def test_a_negated_sglang_switch_is_set_aside_alone():
    # upstream registers SGLang's --NAME as --sglang-NAME, so argparse spells a boolean's --no-NAME --no-sglang-NAME
    rest, words = split_sglang_words(["--no-sglang-lora-use-virtual-experts", "7", "--no-sglang-", "--lr", "1"])
    assert words == ["--no-sglang-lora-use-virtual-experts"]
    assert rest == ["7", "--no-sglang-", "--lr", "1"]


def test_parse_args_keeps_them_and_imports_no_sglang_or_torch():
    code = ("import sys; from miles.utils.arguments import parse_args; "
            "a = parse_args(argv=['--rollout-backend', 'sglang', '--sglang-max-total-tokens', '4096']); "
            "print(a.sglang_words, sorted(m for m in ('torch', 'sglang', 'ray', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['--sglang-max-total-tokens', '4096'] []"


def test_sglang_words_without_the_sglang_backend_are_refused():
    with pytest.raises(MilesConfigError, match=r"--sglang-dtype is an SGLang server argument, but --rollout-backend "
                                               r"is 'torch'.*Add --rollout-backend sglang"):
        parse_args(argv=["--sglang-dtype", "bfloat16"])


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(MilesConfigError, match=r"the SGLang rollout engine is not installed; install it with "
                                               r"`bash scripts/setup.sh --with-sglang`"):
        sglang_args.check_sglang_server_args([], "/model", cuda=False)


@pytest.mark.parametrize(("values", "message"), [
    ({"model_path": "/other"}, r"--sglang-model-path '/other': the engines load --hf-checkpoint \(/model\).*set "
                               r"--hf-checkpoint instead"),
    ({"device": "cuda"}, r"--sglang-device 'cuda': miles places each engine on the CPU"),
    ({"dtype": "auto"}, r"--sglang-dtype 'auto': .*'auto' downcast a float32 checkpoint to float16.*float32"),
    ({"mem_fraction_static": 0.5}, r"--sglang-mem-fraction-static 0.5: .*pass --sglang-max-total-tokens N"),
    ({"random_seed": 3}, r"--sglang-random-seed 3: the engines' seeds come from --rollout-seed"),
    ({"tp_size": 2}, r"--sglang-tp-size 2: miles checks the weights of one rank per engine"),
    ({"rl_on_policy_target": "fsdp"}, r"casts the logits to bfloat16 before the log-softmax"),
    ({"port": 30000}, r"--sglang-port 30000: miles starts each engine.s SGLang server on 127.0.0.1 and a free port"),
    ({"host": "0.0.0.0"}, r"--sglang-host .0.0.0.0.: .*free port.*drop it"),
    ({"api_key": "k"}, r"--sglang-api-key .k.: .*without a key"),
    ({"config": "c.yaml"}, r"--sglang-config 'c.yaml': .*pass its options as --sglang-NAME VALUE"),
    ({"enable_deterministic_inference": True}, r"--sglang-enable-deterministic-inference True: .*none of which runs "
                                               r"on a CPU"),
])
def test_owned_settings_set_wrongly_are_refused(values, message):
    with pytest.raises(MilesConfigError, match=message):
        check_owned(values, "/model", cuda=False)


def test_owned_settings_set_rightly_pass_and_the_user_wins_elsewhere(tmp_path):
    check_owned({"model_path": str(tmp_path), "dtype": "bfloat16", "device": "cpu", "tp_size": 1}, str(tmp_path),
                cuda=False)
    kwargs = engine_kwargs("/model", 5, {"max_total_tokens": 4096, "dtype": "bfloat16"})
    assert kwargs["max_total_tokens"] == 4096 and kwargs["dtype"] == "bfloat16" and kwargs["random_seed"] == 5
    assert engine_kwargs("/model", 5, {})["dtype"] == "float32"


def test_the_original_logprob_switch_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(MilesConfigError, match=r"SGLANG_RETURN_ORIGINAL_LOGPROB is set: .*unset it"):
        check_owned({}, "/model", cuda=False)


def test_a_response_budget_the_kv_cache_cannot_hold_is_refused():
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5]]
    sglang_args.check_kv_capacity(prompts, 9, 16)  # 5 + 9 + 2 = 16 fits
    with pytest.raises(MilesConfigError, match=r"--rollout-max-response-len 10 with a 5-token prompt needs 17 tokens "
                                               r"in one SGLang request, but the engine's KV cache holds 16.*Raise "
                                               r"--sglang-max-total-tokens"):
        sglang_args.check_kv_capacity(prompts, 10, 16)
    sglang_args.check_kv_capacity(prompts, 10_000, None)  # a GPU-sized cache: the context length is the limit
    assert sglang_args.max_request_tokens({}, cuda=False) == sglang_args.DEFAULT_MAX_TOTAL_TOKENS
    assert sglang_args.max_request_tokens({"max_total_tokens": 64}, cuda=False) == 64
    assert sglang_args.max_request_tokens({}, cuda=True) is None


def test_the_preflight_refuses_a_response_length_sglang_would_cut(embedded, tmp_path):
    from miles.ray.preflight import preflight

    args = parse_args(argv=["--rollout-backend", "sglang", "--hf-checkpoint", embedded.checkpoint_dir,
                            "--prompt-data", embedded.train_jsonl, "--rollout-max-response-len", "12",
                            "--sglang-max-total-tokens", "16", "--log-dir", str(tmp_path)])
    with pytest.raises(MilesConfigError, match=r"--rollout-max-response-len 12 with a 5-token prompt needs 19"):
        preflight(args)
