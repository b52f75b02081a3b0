"""The SGLang engine's truncated log-probs, rebuilt from the whole-softmax top log-probs SGLang returns, against a
direct computation (log-softmax over the kept tokens of a known distribution); its sampling parameters."""

import math

import pytest

from miles.rollout.sampling import SamplingOptions
from miles.rollout.sglang_engine import SGLangRolloutEngine, sampling_params, top_logprobs_num, truncated_from_top
from miles.utils.errors import RolloutEngineError

# A 6-token vocabulary; the distribution of one position, by token id.
PROBS = {4: 0.4, 1: 0.25, 5: 0.15, 0: 0.1, 2: 0.06, 3: 0.04}


def _top(count):
    """SGLang's output_top_logprobs entry: (logprob, token_id, text), highest first."""
    ranked = sorted(PROBS.items(), key=lambda item: -item[1])[:count]
    return [(math.log(p), token, None) for token, p in ranked]


@pytest.mark.parametrize(("options", "kept"), [
    (SamplingOptions(top_k=3), [4, 1, 5]),
    (SamplingOptions(top_p=0.6), [4, 1]),  # mass before token 5 is 0.65 > 0.6
    (SamplingOptions(top_p=0.7, top_k=4), [4, 1, 5]),  # mass before 5 is 0.65 <= 0.7, before 0 is 0.8
    (SamplingOptions(min_p=0.3), [4, 1, 5]),  # p >= 0.12
])
def test_the_log_prob_is_the_renormalized_one_over_the_kept_set(options, kept):
    count = options.top_k if options.top_k > 0 else len(PROBS)
    token = kept[-1]
    log_probs, kept_ids = truncated_from_top([_top(count)], [token], options, vocab_size=len(PROBS))
    assert kept_ids == [sorted(kept)]
    assert log_probs[0] == pytest.approx(math.log(PROBS[token] / sum(PROBS[t] for t in kept)), abs=1e-6)


def test_top_k_1_is_log_prob_zero():
    log_probs, _ = truncated_from_top([_top(1)], [4], SamplingOptions(top_k=1), vocab_size=len(PROBS))
    assert log_probs == [0.0]


def test_a_token_outside_the_kept_set_is_a_bug_report():
    with pytest.raises(RolloutEngineError, match="sampled token 0, outside the kept set"):
        truncated_from_top([_top(6)], [0], SamplingOptions(top_p=0.5), vocab_size=len(PROBS))


def test_too_few_top_log_probs_to_cover_the_kept_set_are_refused():
    with pytest.raises(RolloutEngineError, match="all are kept: the kept set may be larger"):
        truncated_from_top([_top(2)], [4], SamplingOptions(top_p=0.99), vocab_size=len(PROBS))


def test_sampling_params_pass_filters_stops_and_neutral_penalties():
    params = sampling_params(0.7, 5, SamplingOptions(top_p=0.9, top_k=0, stop=("7",), stop_token_ids=(3,)))
    assert params["top_k"] == -1 and params["top_p"] == 0.9 and params["min_p"] == 0.0
    assert params["stop"] == ["7"] and params["stop_token_ids"] == [3]
    assert params["repetition_penalty"] == 1.0 and params["max_new_tokens"] == 5 and params["temperature"] == 0.7
    assert sampling_params(1.0, 3, SamplingOptions())["stop"] is None


def test_top_log_probs_cover_the_kept_set_and_never_exceed_the_vocabulary():
    assert top_logprobs_num(SamplingOptions(), 15) is None
    assert top_logprobs_num(SamplingOptions(top_k=20, logprobs="full"), 15) is None
    assert top_logprobs_num(SamplingOptions(top_k=3), 15) == 3
    assert top_logprobs_num(SamplingOptions(top_k=20), 15) == 15  # 20 would kill SGLang's scheduler
    assert top_logprobs_num(SamplingOptions(top_p=0.9), 15) == 15


def _output(tokens, finish):
    return {"output_ids": tokens, "meta_info": {"output_token_logprobs": [(-0.5, t, None) for t in tokens],
                                                "finish_reason": finish, "weight_version": "3"}}


def test_the_status_is_sglangs_finish_reason_and_a_short_length_is_refused():
    engine = object.__new__(SGLangRolloutEngine)
    engine.name = "SGLang rollout engine 0"
    row, version = engine._response(_output([4, 5], {"type": "stop", "matched": 5}), SamplingOptions(), 4)
    assert (row.stopped, row.tokens, row.log_probs, version) == (True, [4, 5], [-0.5, -0.5], 3)
    row, _ = engine._response(_output([4, 5, 6, 7], {"type": "length", "length": 4}), SamplingOptions(), 4)
    assert not row.stopped
    with pytest.raises(RolloutEngineError, match=r"ended a response at 2 tokens for 'length', but "
                                                 r"--rollout-max-response-len is 4: it capped the request"):
        engine._response(_output([4, 5], {"type": "length", "length": 2}), SamplingOptions(), 4)
    with pytest.raises(RolloutEngineError, match="finished a request with"):
        engine._response(_output([4], {"type": "abort", "message": "KV memory"}), SamplingOptions(), 4)
