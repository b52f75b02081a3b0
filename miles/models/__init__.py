"""Hugging Face models as every part of miles loads them (``hf``): both training backends, the rollout engine,
the embedded default and the preflight, so no backend imports another to load its weights."""
