#!/usr/bin/env bash
# Create .venv and install miles with its test and megatron extras; with --with-sglang also the SGLang rollout engine
# (--rollout-backend sglang, docs/sglang.md). torch==2.13.0 goes first: on the machines this project runs on, pip
# finds a CPU build of it locally, and installing it first keeps pip from pulling a multi-GB CUDA build to satisfy
# the dependency. Elsewhere, install a CPU build first yourself (README, "Set-up").
set -euo pipefail
cd "$(dirname "$0")/.."
with_sglang=0
for arg in "$@"; do
    case "$arg" in
        --with-sglang) with_sglang=1 ;;
        *) echo "scripts/setup.sh: unknown option $arg (the only one is --with-sglang)" >&2; exit 2 ;;
    esac
done
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
if [ "$with_sglang" = 1 ]; then
    .venv/bin/python -m pip install --quiet -e ".[test,megatron,sglang]"
    # SGLang and four of its parts without their declared dependencies: those pin torch 2.14.1 with a CUDA stack
    # (gigabytes of nvidia-* wheels that would replace the CPU torch). The [sglang] extra holds what they do need.
    .venv/bin/python -m pip install --quiet --no-deps sglang==0.5.23 compressed-tensors==0.18.0 triton==3.8.0 \
        apache-tvm-ffi==0.1.11 xgrammar==0.2.7
else
    .venv/bin/python -m pip install --quiet -e ".[test,megatron]"
fi
