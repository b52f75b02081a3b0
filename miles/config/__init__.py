"""Configuration: the flags, their rules, the corrections table and the validation of a launch (docs/design.md §6).

Torch-free and the lowest package: it imports nothing else of miles, so a rejected launch costs about as much as
starting Python, and ``miles.utils.arguments`` (upstream's module path) can re-export ``miles.config.arguments``.
"""
