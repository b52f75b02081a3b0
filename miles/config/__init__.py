"""Configuration: the flags, their rules, the corrections table and the validation of a launch (docs/design.md §6).

Torch-free and at the bottom of the import graph beside ``miles.utils``: a rejected launch costs about as much as
starting Python. ``miles.utils.arguments`` re-exports ``miles.config.arguments`` at upstream's module path.
"""
