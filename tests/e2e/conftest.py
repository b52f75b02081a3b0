"""e2e fixtures: one Ray session and one cached embedded default for the whole test session."""

import os

import pytest

from miles.utils.arguments import parse_args

# Small settings: 4 prompts x 4 samples, a few rollouts. Each test adds what it checks. SMALL_RUN pins the torch
# backend to keep the suite's time (megatron-core's start-up in every train process); a later --train-backend in
# a test's argv overrides it, and test_megatron's default-launch test uses SMALL_SETTINGS to run the true default.
# The end-of-run plots cost 3-6 s a run: skipped here, and test_training checks a default run's.
SMALL_SETTINGS = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "4",
                  "--eval-interval", "0", "--no-use-tensorboard", "--no-save-plots"]
SMALL_RUN = ["--train-backend", "torch", *SMALL_SETTINGS]


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    from miles.rollout.embedded import ensure_embedded_default

    cache = tmp_path_factory.mktemp("miles_cache")
    previous = os.environ.get("MILES_CACHE_DIR")
    os.environ["MILES_CACHE_DIR"] = str(cache)
    yield ensure_embedded_default(str(cache))
    if previous is None:
        os.environ.pop("MILES_CACHE_DIR", None)
    else:
        os.environ["MILES_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    ray.init(num_cpus=6, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def make_args(tmp_path, embedded_cache, ray_cluster):
    """Real parser on SMALL_RUN + extra argv, with the run folder under the test's tmp_path."""

    def make(*argv):
        return parse_args(argv=[*SMALL_RUN, "--log-dir", str(tmp_path / "run"), *argv])

    return make
