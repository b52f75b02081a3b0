#!/usr/bin/env bash
# Create .venv and install miles with its test extra. The CPU build of torch goes first, so pip never pulls a
# multi-GB CUDA build to satisfy the dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[test]"
