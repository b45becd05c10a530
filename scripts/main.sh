#!/usr/bin/env bash
# The main job on the bundled sample traces: set up, ingest, analyse, and write the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-out}
rm -rf "$OUT/store"
.venv/bin/tracetool ingest sample_traces/ddp_gloo_2rank --store "$OUT/store" --job ddp_gloo_2rank
.venv/bin/python scripts/summary.py "$OUT/store"
.venv/bin/tracetool report "$OUT/store" --out "$OUT/report"
