"""SGLang's /generate endpoint as the torch engine serves it (miles/rollout/endpoint.py, engine_server.py): the
request's checks, the answer's shape, the witness records, the lock a push shares with a request, and the log-probs
checked against a full forward pass computed here."""

import threading

import httpx
import pytest

from miles.rollout.endpoint import EndpointError, parse_generate, trimmed_text
from miles.rollout.engine_server import EngineServer
from miles.utils.types import Sample, SampleStatus
from tests.fast.rollout.reference import forward_log_probs


def _post(server, body, path="/generate"):
    return httpx.post(server.url + path, json=body, timeout=30)


def test_an_answer_has_sglangs_shape_and_the_engines_log_probs(server, engine):
    prompt = engine.tokenizer("12+345=")["input_ids"]
    answer = _post(server, {"input_ids": prompt, "return_logprob": True, "rid": "r1",
                            "sampling_params": {"temperature": 0.7, "max_new_tokens": 4, "top_k": 5,
                                                "sampling_seed": 3}}).json()
    meta = answer["meta_info"]
    tokens = answer["output_ids"]
    assert meta["id"] == "r1" and meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(tokens)
    assert meta["weight_version"] == "0" and meta["finish_reason"]["type"] in ("stop", "length")
    assert [entry[1] for entry in meta["output_token_logprobs"]] == tokens
    (served,) = server.take_witnessed()[tuple(prompt)]
    assert served.tokens == tuple(tokens)
    assert all(len(ids) <= 5 for ids in served.kept_ids)  # top_k 5 acted
    reference = forward_log_probs(engine, prompt, tokens, 0.7, served.kept_ids)
    assert [entry[0] for entry in meta["output_token_logprobs"]] == pytest.approx(reference, abs=1e-5)
    assert served.weight_versions == [0] and served.weight_fingerprint == engine.weight_fingerprint


def test_the_same_seed_gives_the_same_answer_and_text_prompts_are_tokenized(server):
    body = {"text": ["3+4=", "9="], "sampling_params": {"max_new_tokens": 3, "sampling_seed": 11}}
    first, second = _post(server, body).json(), _post(server, body).json()
    assert isinstance(first, list) and len(first) == 2
    assert [a["output_ids"] for a in first] == [a["output_ids"] for a in second]
    assert "output_token_logprobs" not in first[0]["meta_info"]  # only with return_logprob


@pytest.mark.parametrize(("body", "named"), [
    ({"input_ids": [5], "sampling_params": {"repetition_penalty": 1.3}}, "repetition_penalty"),
    ({"input_ids": [5], "sampling_params": {"n": 2}}, "n=2"),
    ({"input_ids": [5], "stream": True}, "stream"),
    ({"input_ids": [5], "sampling_params": {"frequency": 1}}, "frequency"),
    ({"input_ids": [5], "text": "x"}, "exactly one"),
    ({"input_ids": [], "sampling_params": {}}, "input_ids"),
    ({"input_ids": [5], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"input_ids": [5], "colour": 1}, "colour"),
])
def test_a_request_miles_would_serve_differently_is_refused_naming_the_key(body, named):
    with pytest.raises(EndpointError, match=named):
        parse_generate(body)


def test_the_server_answers_a_refused_request_400_with_its_reason(server):
    refused = _post(server, {"input_ids": [5], "sampling_params": {"presence_penalty": 0.5}})
    assert refused.status_code == 400 and "presence_penalty" in refused.json()["error"]["message"]
    outside = _post(server, {"input_ids": [10**6], "sampling_params": {"max_new_tokens": 1}})
    assert outside.status_code == 400 and "vocabulary" in outside.json()["error"]["message"]


def test_health_model_info_and_weight_version_answer(server, engine):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/health_generate").status_code == 200
    info = httpx.get(server.url + "/get_model_info").json()
    assert info["model_path"] == engine.model_path and info["is_generation"] is True
    assert httpx.get(server.url + "/get_weight_version").json() == {"weight_version": "0"}
    assert httpx.post(server.url + "/flush_cache").status_code == 200


def test_a_request_waits_for_the_lock_a_push_holds_and_an_abort_ends_the_waiting_ones(server):
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
    answers = []
    with server.lock:  # a push in progress: the request must not be served inside it
        waiting = threading.Thread(target=lambda: answers.append(_post(server, body).json()))
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive() and not answers
        assert httpx.post(server.url + "/abort_request", json={"abort_all": True}).status_code == 200
    waiting.join(timeout=30)
    assert answers[0]["meta_info"]["finish_reason"]["type"] == "abort" and answers[0]["output_ids"] == []
    served_after = _post(server, body).json()  # a request after the abort is served
    assert served_after["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_an_answer_updates_a_sample_as_upstream_does():
    sample = Sample(group_index=0, index=0, prompt="p", label="", tokens=[], response_length=0,
                    status=SampleStatus.PENDING)
    sample.update_from_meta_info(None, {"weight_version": "4", "finish_reason": {"type": "length"}})
    assert sample.weight_versions == [4] and sample.status == Sample.Status.TRUNCATED
    sample.update_from_meta_info(None, {"weight_version": "default", "finish_reason": {"type": "abort"}})
    assert sample.weight_versions == [4, 0] and sample.status == SampleStatus.ABORTED


def test_the_text_is_cut_before_the_stop_string_unless_no_stop_trim():
    assert trimmed_text("12 END", ["END"], stopped=True, no_stop_trim=False) == "12 "
    assert trimmed_text("12 END", ["END"], stopped=True, no_stop_trim=True) == "12 END"
    assert trimmed_text("12 END", ["END"], stopped=False, no_stop_trim=False) == "12 END"


class _CountingEngine:
    """The engine with its generate_rows calls counted (row counts per call)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate_rows(self, rows, *args, **kwargs):
        self.calls.append(len(rows))
        return self.engine.generate_rows(rows, *args, **kwargs)


def test_requests_that_wait_together_are_one_batch_and_a_seed_draws_the_same_tokens_alone(engine):
    counting = _CountingEngine(engine)
    served = EngineServer(counting, threading.Lock(), "torch rollout engine", "truncated")
    served.start()
    try:
        prompts = [engine.tokenizer(text)["input_ids"] for text in ("3+4=", "12+345=", "9=", "1+1+1+1=")]
        bodies = [{"input_ids": prompts[i % 4], "return_logprob": True,
                   "sampling_params": {"max_new_tokens": 4, "top_k": 5, "sampling_seed": 100 + i}} for i in range(8)]
        answers = [None] * 8
        with served.lock:  # the engine is busy: the requests wait together
            threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, _post(served, bodies[i]).json()))
                       for i in range(8)]
            for thread in threads:
                thread.start()
            for _ in range(200):  # until all 8 wait (bounded: 10 s)
                if served.waiting.qsize() + sum(counting.calls) >= 7:
                    break
                threading.Event().wait(0.05)
        for thread in threads:
            thread.join(timeout=30)
        assert sum(counting.calls) == 8 and len(counting.calls) <= 2  # the first may have been taken alone
        for body, batched in zip(bodies, answers, strict=True):
            alone = _post(served, body).json()
            assert alone["output_ids"] == batched["output_ids"]  # the row's own generator: its seed decides
            assert [e[0] for e in alone["meta_info"]["output_token_logprobs"]] == pytest.approx(
                [e[0] for e in batched["meta_info"]["output_token_logprobs"]], abs=1e-5)  # padding: last bits only
    finally:
        served.stop()
