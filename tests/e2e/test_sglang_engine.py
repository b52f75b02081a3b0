"""One real SGLang engine in a Ray actor: its log-probs are the trainer's, a push is loaded and proved by SGLang's
own checksums, an update SGLang ignored or weights it holds that differ from the push stop with
OffPolicyGuardError, and SGLang never called a stand-in. The references (a transformers forward pass, the digests
SGLang reports) are independent of the code under test."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from miles.guard.fingerprint import weights_fingerprint
from tests.e2e.sglang_marks import needs_sglang

pytestmark = [pytest.mark.e2e, pytest.mark.sglang, needs_sglang, pytest.mark.timeout(900)]

# float32 engine vs a float32 forward pass over the same tokens: both are ~10 float32 ops deep per logit on this
# model (hidden 64, 2 layers), ~1e-6 relative each; 1e-5 leaves an order of magnitude (measured: 5e-7).
LOG_PROB_TOL = 1e-5


def _faulty_engine_class():
    from miles.rollout.sglang_engine import SGLangRolloutEngine

    class FaultyEngine(SGLangRolloutEngine):
        """The real engine, with two faults a test can switch on: the update outside SGLang's weight-update
        session (SGLang refuses and keeps its weights) and a push of other tensors than the trainer's."""

        fault = None

        def set_fault(self, fault):
            self.fault = fault

        def _call(self, what, version, result):
            if self.fault == "skip_begin" and what == "begin_weight_update":
                self._post("/end_weight_update")  # close the session it just opened: the update runs outside it
            return super()._call(what, version, result)

        def _update_from_tensor(self, state_dict, version):
            if self.fault == "other_tensors":
                state_dict = dict(state_dict, **{"model.norm.weight": state_dict["model.norm.weight"] * 0.5})
            return super()._update_from_tensor(state_dict, version)

    return FaultyEngine


EXTRA_EOS = 8  # the token "5": a second eos id in generation_config.json, as models with several end tokens have


@pytest.fixture(scope="module")
def engine(embedded_cache, ray_cluster, tmp_path_factory):
    """The engine on the embedded weights, from a copy whose generation_config.json lists a second eos id."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    folder = tmp_path_factory.mktemp("sglang")
    checkpoint = folder / "checkpoint"
    shutil.copytree(embedded_cache.checkpoint_dir, checkpoint)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, EXTRA_EOS]}))
    log = folder / "stand_ins.log"
    handle = ray.remote(_faulty_engine_class()).options(num_cpus=1).remote(str(checkpoint), 7, {}, 0, str(log))
    assert ray.get(handle.ready.remote(), timeout=600) == "SGLang rollout engine 0"
    yield handle, log
    ray.get(handle.shutdown.remote())
    ray.kill(handle)


@pytest.fixture(scope="module")
def hf_model(embedded_cache):
    return AutoModelForCausalLM.from_pretrained(embedded_cache.checkpoint_dir, dtype=torch.float32).eval()


def _push(handle, model, version):
    state_dict = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    payload = {"version": version, "fingerprint": weights_fingerprint(state_dict), "state_dict": state_dict}
    return ray.get(handle.load_pushed.remote(payload)), payload["fingerprint"]


def _reference_log_probs(model, samples, temperature):
    """log softmax(logits / T)[token] of each response token, from one forward pass per sample."""
    out = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.tokens])
            logits = model(input_ids=ids).logits[0].float() / temperature  # (T, V)
            prompt_len = len(sample.tokens) - sample.response_length
            positions = torch.arange(prompt_len - 1, len(sample.tokens) - 1)
            log_probs = torch.log_softmax(logits[positions], dim=-1)
            out.append(log_probs.gather(1, ids[0, prompt_len:, None]).squeeze(1))
    return out


def _prompts(embedded_cache, count):
    lines = Path(embedded_cache.train_jsonl).read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def test_a_push_is_loaded_and_its_fingerprint_is_the_trainers(engine, hf_model):
    handle, _ = engine
    with torch.no_grad():  # other weights than the folder's, so a push SGLang ignored would show
        for parameter in hf_model.parameters():
            parameter.mul_(0.9)
    (version, sent, held), fingerprint = _push(handle, hf_model, 1)
    assert (version, sent, held) == (1, fingerprint, fingerprint)
    perf = ray.get(handle.push_perf.remote())
    assert set(perf) == {"perf/sglang_update_s", "perf/sglang_checksum_s", "perf/sglang_expected_digests_s"}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_are_the_trainers_and_stamped_with_sglangs_version(engine, hf_model, embedded_cache, temperature):
    handle, _ = engine
    samples = ray.get(handle.generate.remote(_prompts(embedded_cache, 6), 4, temperature, 3, 0))
    assert len(samples) == 24 and [s.group_index for s in samples] == [i // 4 for i in range(24)]
    assert all(s.weight_versions == [1] and s.response_length == len(s.rollout_log_probs) for s in samples)
    reference = _reference_log_probs(hf_model, samples, temperature)
    diff = max(float((torch.tensor(s.rollout_log_probs) - ref).abs().max()) for s, ref in zip(samples, reference))
    assert diff <= LOG_PROB_TOL


@pytest.mark.parametrize("top_k", [1, 3])
def test_top_k_log_probs_are_the_renormalized_top_k(engine, hf_model, embedded_cache, top_k):
    """SGLang's whole-softmax top log-probs, renormalized over the kept set, against a direct top-k computation."""
    from tests.fast.rollout.test_sampling import _top_k_reference

    handle, _ = engine
    samples = ray.get(handle.generate.remote(_prompts(embedded_cache, 6), 4, 0.8, 3, 0, {"top_k": top_k}))
    if top_k == 1:
        assert all(abs(lp) <= 1e-6 for s in samples for lp in s.rollout_log_probs)
    reference = _top_k_reference(hf_model, samples, 0.8, top_k)
    diff = max(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.rollout_log_probs, ref))
    assert diff <= LOG_PROB_TOL
    assert all(len(ids) == top_k for s in samples for ids in s.sampling_kept_ids)


def test_a_stop_token_or_string_ends_a_response_completed_as_sglangs_finish_reason_says(engine, embedded_cache):
    from miles.utils.types import SampleStatus

    handle, _ = engine
    seven = 10  # the token "7" of the embedded vocabulary
    for sampling in ({"stop_token_ids": [seven]}, {"stop": ["7"]}):  # as the torch engine: the stop is kept
        samples = ray.get(handle.generate.remote(_prompts(embedded_cache, 16), 4, 1.5, 4, 0, sampling))
        on_seven = [s for s in samples if s.tokens[-1] == seven]
        assert on_seven and all(s.status == SampleStatus.COMPLETED for s in on_seven)
        assert all(seven not in s.tokens[s.prompt_length:-1] for s in samples)
        assert all(s.status == SampleStatus.COMPLETED or s.response_length == 4 for s in samples)


def test_every_eos_id_of_the_generation_config_stops_as_on_the_torch_engine(engine, embedded_cache):
    """SGLang stops on each eos id of generation_config.json; miles marks those samples COMPLETED (from
    finish_reason), as the torch engine does on the same folder (tests/fast/rollout/test_sampling.py)."""
    from miles.utils.types import SampleStatus

    handle, _ = engine
    samples = ray.get(handle.generate.remote(_prompts(embedded_cache, 16), 4, 1.5, 4, 1))
    on_extra = [s for s in samples if s.tokens[-1] == EXTRA_EOS]
    assert on_extra and all(s.status == SampleStatus.COMPLETED for s in on_extra)
    assert all(EXTRA_EOS not in s.tokens[s.prompt_length:-1] for s in samples)


def test_an_update_sglang_refused_stops_with_the_guards_error(engine, hf_model):
    from miles.utils.errors import OffPolicyGuardError

    handle, _ = engine
    ray.get(handle.set_fault.remote("skip_begin"))
    with pytest.raises(OffPolicyGuardError, match="weight version 2 was not loaded: SGLang's update_weights_from"):
        _push(handle, hf_model, 2)
    ray.get(handle.set_fault.remote(None))


def test_held_weights_that_differ_from_the_push_stop_with_the_guards_error(engine, hf_model):
    from miles.utils.errors import OffPolicyGuardError

    handle, _ = engine
    ray.get(handle.set_fault.remote("other_tensors"))
    with pytest.raises(OffPolicyGuardError, match=r"does not hold the pushed weights: 1 tensor\(s\) differ "
                                                  r"\(\['model.norm.weight'\]\)"):
        _push(handle, hf_model, 3)
    ray.get(handle.set_fault.remote(None))
    (version, sent, held), _ = _push(handle, hf_model, 4)  # a good push afterwards is loaded again
    assert version == 4 and sent == held


def test_sglang_never_called_a_stand_in(engine):
    _, log = engine
    assert not log.exists() or log.read_text() == ""


def test_sglangs_own_parser_types_the_values_and_names_close_matches():
    from miles.rollout.sglang_args import parse_sglang_words
    from miles.utils.errors import MilesConfigError

    values = parse_sglang_words(["--sglang-max-total-tokens", "4096", "--sglang-enable-deterministic-inference",
                                 "--sglang-dtype=bfloat16"])
    assert values == {"max_total_tokens": 4096, "enable_deterministic_inference": True, "dtype": "bfloat16"}
    with pytest.raises(MilesConfigError, match=r"has no server argument --max-total-token \(did you mean "
                                               r"--sglang-max-total-tokens"):
        parse_sglang_words(["--sglang-max-total-token", "4096"])
    with pytest.raises(MilesConfigError, match=r"--sglang-\* flags: .*tp-size"):
        parse_sglang_words(["--sglang-tp-size", "two"])
    # a boolean switch's negation, as upstream's parser spells it: SGLang's --no-NAME
    assert parse_sglang_words(["--no-sglang-lora-strict-loading"]) == {"lora_strict_loading": False}
    with pytest.raises(MilesConfigError, match=r"has no server argument --no-lora-strict-loadin \(did you mean "
                                               r"--no-sglang-lora-strict-loading"):
        parse_sglang_words(["--no-sglang-lora-strict-loadin"])
