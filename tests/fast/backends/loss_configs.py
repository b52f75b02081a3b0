"""``LossConfig`` as a run builds it: from the real parser's namespace, which the corrections table's rows and their
weight functions read (upstream's TIS-hook signature takes the run's ``args``)."""

import dataclasses

from miles.backends.training_utils.loss import LossConfig
from miles.utils.arguments import parse_args


def loss_config(*flags: str, **fields) -> LossConfig:
    """The loss configuration of a launch with ``flags`` (e.g. ``"--use-tis", "--tis-clip", "1.1"``), with the
    loss-only ``fields`` replaced."""
    return dataclasses.replace(LossConfig.from_args(parse_args(argv=list(flags))), **fields)
