"""Upstream's hook modules for the loss (``--custom-tis-function-path`` built-ins live in ``corrections``)."""
