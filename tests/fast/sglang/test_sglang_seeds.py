"""The SGLang engine's per-sample seeds, with SGLang's server replaced by a recorder of its /generate requests (no
server starts): each row of a rollout gets its own ``sampling_seed``, a function of the rollout's seed and the row
alone."""

import hashlib

from transformers import AutoConfig

from miles.models.hf import load_tokenizer
from miles.rollout.engine import eos_token_id_of
from miles.rollout.sglang_engine import SGLangRolloutEngine


class _RecordingServer:
    def __init__(self, token: int) -> None:
        self.token, self.sampling_params = token, None

    def call(self, path, body):
        assert path == "/generate" and body["return_logprob"] is True
        self.sampling_params = body["sampling_params"]
        meta = {"output_token_logprobs": [[-0.5, self.token, None]], "weight_version": "1",
                "finish_reason": {"type": "stop"}}  # the eos token ended each response
        return 200, [{"output_ids": [self.token], "meta_info": meta} for _ in body["input_ids"]]


def _engine(embedded) -> SGLangRolloutEngine:
    engine = object.__new__(SGLangRolloutEngine)  # the attributes generate() reads, without starting SGLang
    engine.name, engine.weight_fingerprint = "SGLang rollout engine 0", "f" * 64
    engine.config = AutoConfig.from_pretrained(embedded.checkpoint_dir)
    engine.tokenizer = load_tokenizer(embedded.checkpoint_dir)
    engine.eos_token_id = eos_token_id_of(engine.tokenizer, engine.config, embedded.checkpoint_dir)
    engine.max_request_tokens = None  # no KV-cache limit to check
    engine.server = _RecordingServer(engine.eos_token_id)
    return engine


def _expected_seed(rollout_seed: int, row: int) -> int:
    """sha256 of "rollout_seed:row", its first 8 bytes little-endian, cut to 63 bits (an int64 SGLang accepts)."""
    return int.from_bytes(hashlib.sha256(f"{rollout_seed}:{row}".encode()).digest()[:8], "little") & (2**63 - 1)


def test_each_row_is_sent_with_its_own_seed_from_the_rollout_seed(embedded):
    engine = _engine(embedded)
    prompts = [{"prompt": "1+1=", "label": "2"}, {"prompt": "2+2=", "label": "4"}]
    engine.generate(prompts, n_samples_per_prompt=3, temperature=1.0, max_response_len=2, seed=12345)
    seeds = [params["sampling_seed"] for params in engine.server.sampling_params]
    assert seeds == [_expected_seed(12345, row) for row in range(6)]
    assert len(set(seeds)) == 6  # the samples of one prompt are not copies of each other
    for params in engine.server.sampling_params:
        assert (params["temperature"], params["max_new_tokens"]) == (1.0, 2)
