"""Upstream's filter hub, under upstream's module paths: launch scripts pass
``--dynamic-sampling-filter-path miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std``."""
