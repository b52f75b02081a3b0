"""The RolloutManager: owns the rollout engines, the prompt data and the reward function.

A plain class, made a Ray actor by ``create_rollout_manager``. It only dispatches, so its module imports no torch
or transformers (the engines are created by the caller, who has them imported already); that keeps the manager's
process start cheap (a flag that needs one imports it when set: torch for --save-debug-rollout-data, the tokenizer
for --apply-chat-template). ``generate(rollout_id)`` returns the rollout and its
metrics as two objects, so the driver awaits the small metrics while the samples travel from here to the train
actors as an object reference.
"""

from __future__ import annotations

import os
import time
import zlib

import ray

from miles.guard.display import short
from miles.ranks.placement import CPUS_PER_BUNDLE
from miles.ray.cluster import Placement
from miles.rollout.custom_generate import custom_samples, load_generate_function, upstream_sampling_params
from miles.rollout.data_source import PromptDataSource, load_prompts
from miles.rollout.dynamic_sampling import filter_verdict, load_dynamic_filter, sample_dynamically
from miles.rollout.engine_actor import engine_actor_class
from miles.rollout.eval_config import eval_datasets, eval_metrics, load_eval_sets
from miles.rollout.protocol import engine_class
from miles.rollout.rm import get_reward_fn
from miles.utils.errors import REPORT_BUG, DivergenceError, OffPolicyGuardError, RolloutEngineError
from miles.utils.http_utils import init_http_client
from miles.utils.types import RolloutBatch, Sample, SampleStatus


def rollout_seed(base_seed: int, rollout_id: int, engine_index: int, round_index: int = 0) -> int:
    """Sampling seed of one engine's share of rollout ``rollout_id`` (of its round ``round_index`` under dynamic
    sampling; round 0 keeps the seed of a rollout without): a rollout is reproducible from its id."""
    suffix = f":{round_index}" if round_index else ""
    return zlib.crc32(f"{base_seed}:{rollout_id}:{engine_index}{suffix}".encode())


def _split(items: list, parts: int) -> list[list]:
    """Contiguous, nearly equal parts (prompt groups stay whole because whole prompts are split)."""
    size, extra = divmod(len(items), parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + size + (part < extra))
    return [items[bounds[i] : bounds[i + 1]] for i in range(parts)]


class RolloutManager:
    def __init__(self, args, engines: list) -> None:
        self.args = args
        self.engines = engines
        self.data_source = PromptDataSource(
            load_prompts(args, args.prompt_data, "--prompt-data"),
            args.rollout_batch_size, args.rollout_shuffle, args.rollout_seed,
        )
        self.eval_sets = load_eval_sets(args, eval_datasets(args))  # --eval-config or --eval-prompt-data
        self.reward_fn = get_reward_fn(args.rm_type, args.custom_rm_path)
        path = args.custom_generate_function_path
        self.generate_fn = load_generate_function(path) if path else None
        init_http_client(args)  # the generate and reward functions' HTTP client (--rollout-request-timeout)
        self.eval_rewards = [get_reward_fn(dataset.rm_type, args.custom_rm_path) for dataset, _ in self.eval_sets]
        self.dynamic_filter = load_dynamic_filter(args.dynamic_sampling_filter_path)
        self.weight_version = 0
        self.push_perf: dict[str, float] = {}  # the latest push's cost inside the engines (SGLang)
        self.last_push_s = 0.0  # the latest push, export ready to every engine loaded; reported with the next rollout

    def load_weights(self, pushed: list) -> None:
        """Load the trainer's push ``{"version", "fingerprint", "state_dict"}`` into every engine, and check that
        each engine's fingerprint of the weights it loaded equals the trainer's (the guard checks it again on every
        sample).

        ``pushed`` is ``[ref]`` of the push, wrapped in a list so that Ray hands the reference on instead of
        fetching the weights into this process: each engine reads them from the object store, and the manager
        never deserializes and re-sends them.
        """
        (payload_ref,) = pushed
        loads = [engine.load_pushed.remote(payload_ref) for engine in self.engines]
        # The driver may submit the push before the export ran (train.py does): time it from the export's end.
        ray.wait([payload_ref], fetch_local=False)
        start = time.perf_counter()
        loaded = ray.get(loads)
        version, fingerprint, _ = loaded[0]  # every engine read the same push (the trainer pushes only finite weights)
        wrong = [index for index, (_, _, engine_fingerprint) in enumerate(loaded) if engine_fingerprint != fingerprint]
        if wrong:
            raise OffPolicyGuardError(
                f"weight version {version}: rollout engine(s) {wrong} loaded weights with fingerprint(s) "
                f"{[short(loaded[i][2]) for i in wrong]}, but the trainer pushed fingerprint {short(fingerprint)}. "
                f"{REPORT_BUG}"
            )
        self.weight_version = version
        self.last_push_s = time.perf_counter() - start
        costs = ray.get([engine.push_perf.remote() for engine in self.engines])  # e.g. SGLang's update and checksum
        self.push_perf = {name: max(cost[name] for cost in costs) for name in costs[0]}  # the slowest engine's

    def set_router(self, ip: str, port: int) -> None:
        """The router's address, for the generate functions (``args.sglang_router_ip/port``, as upstream)."""
        self.args.sglang_router_ip, self.args.sglang_router_port = ip, port

    def prompt_position(self, rollout_id: int) -> int:
        """Where rollout ``rollout_id``'s prompts start in the data stream (saved with a checkpoint)."""
        return self.data_source.position(rollout_id)

    def continue_prompts_at(self, rollout_id: int, position: int) -> None:
        """A resume: rollout ``rollout_id``'s prompts start at the saved ``position``."""
        self.data_source.continue_at(rollout_id, position)

    def _sample(self, prompts: list[dict], n_samples: int, rollout_id: int, seed_offset: int,
                temperature: float, max_response_len: int, sampling: dict, reward_fn=None,
                round_index: int = 0) -> list[Sample]:
        if self.generate_fn is not None:  # upstream's per-sample function, over HTTP (miles/rollout/custom_generate.py)
            seed = rollout_seed(self.args.rollout_seed + seed_offset, rollout_id, 0, round_index)
            samples = custom_samples(self.generate_fn, self.args, prompts, n_samples,
                                     upstream_sampling_params(temperature, max_response_len, sampling), seed,
                                     evaluation=seed_offset > 0, take_witnessed=self._take_witnessed)
        else:
            samples = self._engine_samples(prompts, n_samples, rollout_id, seed_offset, temperature,
                                           max_response_len, sampling, round_index)
        for index, sample in enumerate(samples):  # renumber across engines; groups stay contiguous
            sample.index, sample.group_index = index, index // n_samples
        unscored = [sample for sample in samples if sample.reward is None]  # a generate function may have set it
        for sample, reward in zip(unscored, (reward_fn or self.reward_fn).score(self.args, unscored), strict=True):
            sample.reward = reward
        return samples

    def _take_witnessed(self) -> dict:
        """What every engine's HTTP server served since the last call, by tokens (``EngineServer.take_witnessed``)."""
        merged: dict[tuple, list] = {}
        for witnessed in ray.get([engine.take_witnessed.remote() for engine in self.engines]):
            for tokens, answers in witnessed.items():
                merged.setdefault(tokens, []).extend(answers)
        return merged

    def _engine_samples(self, prompts: list[dict], n_samples: int, rollout_id: int, seed_offset: int,
                        temperature: float, max_response_len: int, sampling: dict,
                        round_index: int) -> list[Sample]:
        shares = _split(prompts, len(self.engines))
        futures = [
            engine.generate.remote(
                share, n_samples, temperature, max_response_len,
                rollout_seed(self.args.rollout_seed + seed_offset, rollout_id, index, round_index), sampling,
            )
            for index, (engine, share) in enumerate(zip(self.engines, shares, strict=True))
            if share
        ]
        try:
            generated = ray.get(futures)
        except DivergenceError as error:  # an engine's error arrives wrapped; name the rollout and the weights
            raise DivergenceError(
                f"rollout {rollout_id}, weight version {self.weight_version}: {getattr(error, 'cause', error)}"
            ) from None
        return [sample for share in generated for sample in share]

    def _groups(self, prompts: list[dict], rollout_id: int, round_index: int) -> list[list[Sample]]:
        """One round's samples, split into groups (the samples of one prompt)."""
        n = self.args.n_samples_per_prompt
        samples = self._sample(prompts, n, rollout_id, 0, self.args.rollout_temperature,
                               self.args.rollout_max_response_len,
                               sampling_options(self.args, self.args.rollout_top_p, self.args.rollout_top_k),
                               round_index=round_index)
        return [samples[i : i + n] for i in range(0, len(samples), n)]

    def generate(self, rollout_id: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Rollout ``rollout_id``: --rollout-batch-size groups, drawn in rounds of --over-sampling-batch-size prompts
        and kept by --dynamic-sampling-filter-path (one round, all kept, without them; miles.rollout.dynamic_sampling).
        Every round runs inside this call, so no weight push lands between them: each sample carries the version
        its engine stamped, and the guard checks each sample's own."""
        start = time.perf_counter()
        result = sample_dynamically(
            rollout_id, self.args.rollout_batch_size, self.args.over_sampling_batch_size, len(self.data_source),
            draw=lambda count: self.data_source.draw(rollout_id, count),
            generate=lambda prompts, round_index: self._groups(prompts, rollout_id, round_index),
            keep=filter_verdict(self.dynamic_filter, self.args), filter_name=self.args.dynamic_sampling_filter_path)
        self.data_source.finish(rollout_id)
        samples = [sample for group in result.groups for sample in group]
        for index, sample in enumerate(samples):  # the kept groups renumbered, contiguous as the trainer expects
            sample.index, sample.group_index = index, index // self.args.n_samples_per_prompt
        if self.args.save_debug_rollout_data:
            save_debug_rollout_data(self.args.save_debug_rollout_data, rollout_id, samples)
        rewards = [sample.reward for sample in samples]
        metrics = {
            "rollout/reward_mean": sum(rewards) / len(rewards),
            "rollout/response_length_mean": sum(s.response_length for s in samples) / len(samples),
            "rollout/truncated_fraction": sum(s.status == SampleStatus.TRUNCATED for s in samples) / len(samples),
            "rollout/num_samples": float(len(samples)),
            "rollout/weight_version": float(self.weight_version),
            **(result.metrics() if dynamic_sampling(self.args) else {}),
            "perf/generate_s": time.perf_counter() - start,
            "perf/last_push_s": self.last_push_s,
            **self.push_perf,
        }
        return RolloutBatch(rollout_id, samples), metrics

    def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Each evaluation dataset (``miles.rollout.eval_config``) sampled with its own samples per prompt,
        temperature, top-p/top-k, length, stops and reward, seeded apart from the training rollouts and from each
        other; metrics per dataset as upstream names them, and miles' totals."""
        if not self.eval_sets:
            return {}
        results = []
        for index, (dataset, prompts) in enumerate(self.eval_sets):
            sampling = {**sampling_options(self.args, dataset.top_p, dataset.top_k),
                        "stop": list(dataset.stop), "stop_token_ids": list(dataset.stop_token_ids)}
            results.append((dataset.name, self._sample(
                prompts, dataset.n_samples_per_eval_prompt, rollout_id, seed_offset=1 + index,
                temperature=dataset.temperature, max_response_len=dataset.max_response_len, sampling=sampling,
                reward_fn=self.eval_rewards[index])))
        if self.args.save_debug_rollout_data:
            every = [sample for _, samples in results for sample in samples]
            save_debug_rollout_data(self.args.save_debug_rollout_data, rollout_id, every, evaluation=True)
        return eval_metrics(results)


def dynamic_sampling(args) -> bool:
    """Whether the rollout over-samples or filters (then it reports the filter's metrics)."""
    return bool(args.dynamic_sampling_filter_path) or args.over_sampling_batch_size != args.rollout_batch_size


def sampling_options(args, top_p: float, top_k: int) -> dict:
    """The engines' ``SamplingOptions`` fields (``miles.rollout.sampling``) as a plain dict: the manager imports no
    torch, and Ray sends a dict as it is."""
    return {"top_p": top_p, "top_k": top_k, "min_p": args.rollout_min_p, "stop": list(args.rollout_stop or ()),
            "stop_token_ids": list(args.rollout_stop_token_ids or ()), "logprobs": args.sampling_logprobs}


def save_debug_rollout_data(path_template: str, rollout_id: int, samples: list[Sample], evaluation: bool = False) -> str:
    """Upstream's ``--save-debug-rollout-data`` file: ``torch.save({"rollout_id", "samples": [Sample.to_dict()]})``
    at the template with ``{rollout_id}`` filled in (``eval_<id>`` for an evaluation), so the log-probs can be
    checked from outside."""
    import torch  # only with the flag: the manager's process otherwise never loads torch

    path = path_template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": [sample.to_dict() for sample in samples]}, path)
    return path


def create_rollout_manager(args, placement: Placement):
    """The manager actor (no CPU of its own: it only dispatches) and one engine actor per engine bundle."""
    engine_cpus = 0 if args.colocate else CPUS_PER_BUNDLE
    # torch + transformers (and sglang): imported here, where the caller has them already, never by the manager,
    # which receives the engines' handles as EngineActor shells (miles/rollout/engine_actor.py).
    engine = engine_class(args.rollout_backend)
    actor_class = ray.remote(engine_actor_class(engine))
    engines = [
        actor_class.options(num_cpus=engine_cpus, scheduling_strategy=placement.strategy(bundle))
        .remote(engine, *engine.init_args(args, index))
        for index, bundle in enumerate(placement.engine_bundles)
    ]
    placement.actors.extend(engines)
    placement.engines.extend(engines)
    if engine.waits_for_start:
        wait_for_engines(engines, args.rollout_engine_start_timeout)
    manager = ray.remote(RolloutManager).options(num_cpus=0).remote(args, engines)
    placement.actors.append(manager)
    return manager


def wait_for_engines(engines: list, timeout_s: float) -> None:
    """Every engine answers ``ready()`` within ``timeout_s``; else one ``RolloutEngineError`` naming the ones that
    did not (an engine whose start failed raises its own one-line error instead)."""
    pending = {engine.ready.remote(): index for index, engine in enumerate(engines)}
    _, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    if late:
        raise RolloutEngineError(
            f"rollout engine(s) {sorted(pending[ref] for ref in late)} did not start within "
            f"--rollout-engine-start-timeout {timeout_s:g} s; raise it on a busy machine (an SGLang start takes "
            "about 30 s on 2 cores), or lower --rollout-num-engines.")
    ray.get(list(pending))  # an engine that failed to start raises its own error here
