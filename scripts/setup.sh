#!/usr/bin/env bash
# Create .venv and install miles with its test and megatron extras. torch==2.13.0 goes first: on the machines this project runs
# on, pip finds a CPU build of it locally, and installing it first keeps pip from pulling a multi-GB CUDA build to
# satisfy the dependency. Elsewhere, install a CPU build first yourself (README, "Set-up").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e ".[test,megatron]"
