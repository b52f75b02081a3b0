"""Logging set-up shared by the drivers."""

import logging

logger = logging.getLogger("miles")


def configure_logging(args) -> None:
    """Configure the ``miles`` logger once, then log every value ``miles_validate_args`` derived and what the chosen
    combination of corrections means (``args.notes``, from ``miles_validate_args``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for line in getattr(args, "derived", []):
        logger.info("derived %s", line)
    for note in getattr(args, "notes", []):
        logger.info(note)
