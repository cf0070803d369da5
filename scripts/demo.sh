#!/usr/bin/env bash
# Sets everything up, then trains the built-in example (a small GPT-style transformer with
# AdamW on synthetic data) under ridgescope, prints its report and writes it to out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
.venv/bin/python examples/train_tiny_gpt.py --out out/demo "$@"
