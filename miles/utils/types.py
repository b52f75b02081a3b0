"""The unit of data that travels from the rollout engine to the trainer."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar


class SampleStatus(str, enum.Enum):
    PENDING = "pending"  # not generated yet (a custom generate function receives its sample so)
    COMPLETED = "completed"  # the response ended with a stop token (<eos>, a stop id) or a stop string
    TRUNCATED = "truncated"  # the response hit --rollout-max-response-len before <eos>
    ABORTED = "aborted"  # the engine aborted the request (SGLang's finish_reason "abort"); never trained on


# SGLang's finish_reason.type -> the sample's status (upstream's ``Sample.update_from_meta_info``)
FINISH_STATUS = {"stop": SampleStatus.COMPLETED, "length": SampleStatus.TRUNCATED, "abort": SampleStatus.ABORTED}


@dataclass
class Sample:
    """One prompt + one sampled response.

    ``tokens`` is prompt + response (no padding); the response is its last ``response_length`` tokens and
    ends at (and includes) ``<eos>`` when the sample completed. ``loss_mask`` and ``rollout_log_probs`` have
    one entry per response token; ``rollout_log_probs[t]`` is log softmax(logits / temperature) of response
    token t under the engine's weights, the same definition the trainer uses. Under top-k / top-p / min-p
    sampling, ``sampling_kept_ids[t]`` lists the token ids the engine kept at response position t and
    ``rollout_log_probs[t]`` is the log-prob of the distribution renormalized over them; the trainer recomputes its
    log-probs under that same set (``miles.rollout.sampling``). None: sampled from the whole softmax.
    """

    group_index: int  # index of the prompt within the rollout; samples of one prompt are contiguous
    index: int  # index of the sample within the rollout
    prompt: str
    label: Any  # the dataset's value, as upstream keeps it: a string, a number, or an object as a dict
    tokens: list[int]
    response_length: int
    response: str = ""
    reward: float | None = None
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)  # engine weight version(s) that sampled it
    weight_fingerprint: str | None = None  # hash of the weights the engine actually loaded (miles.guard.fingerprint)
    status: SampleStatus = SampleStatus.COMPLETED
    sampling_kept_ids: list[list[int]] | None = None  # per response token: the ids the truncated sampler kept
    metadata: dict = field(default_factory=dict)  # a generate function's own notes (upstream's field), not trained on
    # a custom generate function's engine turns, over response positions: {"turn", "start", "end", "weight_version"}
    segments: list[dict] | None = None

    Status: ClassVar = SampleStatus  # upstream's spelling, ``Sample.Status.COMPLETED``

    def to_dict(self) -> dict:
        """Plain Python values, as upstream's ``Sample.to_dict`` (``--save-debug-rollout-data``)."""
        return {**dataclasses.asdict(self), "status": self.status.value}

    def get_reward_value(self, args) -> float | None:
        """The reward a filter reads (upstream's signature; miles' rewards are scalars, so ``args`` is unused)."""
        return self.reward

    def update_from_meta_info(self, args, meta_info: dict) -> None:
        """Upstream's update from an engine's ``/generate`` answer: the weight version that served it (SGLang's
        string; "default", the folder's weights, is version 0) and the status from ``finish_reason``."""
        if "weight_version" in meta_info:
            stamped = meta_info["weight_version"]
            self.weight_versions.append(0 if stamped in (None, "default") else int(stamped))
        self.status = FINISH_STATUS.get(meta_info["finish_reason"]["type"], self.status)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length


@dataclass
class RolloutBatch:
    """One rollout: every sample of ``rollout_batch_size`` prompts, rewards filled in, grouped by prompt."""

    rollout_id: int
    samples: list[Sample]
