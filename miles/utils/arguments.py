"""Upstream's module path of the argument parser and the async off-policy contract (``miles.config.arguments``).

``from miles.utils.arguments import parse_args, validate_async_off_policy_correction`` keeps working for
upstream's users and tests; the code lives in the configuration package (docs/design.md §6).
"""

from miles.config.arguments import (  # noqa: F401  (re-exported)
    ASYNC_PPO_CORRECTION_MESSAGE,
    async_staleness_warning,
    build_parser,
    check_async_colocation,
    check_async_max_weight_staleness,
    contract_message,
    correction_combination_note,
    get_miles_extra_args_provider,
    miles_validate_args,
    parse_args,
    validate_async_off_policy_correction,
)
