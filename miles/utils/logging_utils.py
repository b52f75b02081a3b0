"""Logging set-up shared by the drivers.

``logging`` is imported by the first call, not with this module: the drivers import it before the launch's checks,
and a refused launch should cost little more than starting Python (docs/benchmarks.md).
"""


def configure_logging(args):
    """Configure the ``miles`` logger once, then log every value ``miles_validate_args`` derived and what the chosen
    combination of corrections means (``args.notes``, from ``miles_validate_args``); returns that logger."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per HTTP request otherwise (the router's)
    logger = logging.getLogger("miles")
    for line in getattr(args, "derived", []):
        logger.info("derived %s", line)
    for note in getattr(args, "notes", []):
        logger.info(note)
    return logger
