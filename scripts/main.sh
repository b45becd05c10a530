#!/usr/bin/env bash
# The main job on the bundled sample traces: set up, ingest, analyse, report, and replay.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-out}
rm -rf "$OUT/store"
.venv/bin/tracetool ingest sample_traces/ddp_gloo_2rank --store "$OUT/store" --job ddp_gloo_2rank
.venv/bin/python scripts/summary.py "$OUT/store"
.venv/bin/tracetool report "$OUT/store" --out "$OUT/report"
# replay: the job traced under a 1 Gbit/s shaped network (sample_traces/netlab), projected
# onto 200 Mbit/s (timeline for Perfetto + chart) and swept over bandwidths (table + chart)
rm -rf "$OUT/netlab_store" "$OUT/replay"
mkdir -p "$OUT/replay"
.venv/bin/tracetool ingest sample_traces/netlab/bw_1gbit --store "$OUT/netlab_store" --job netlab_1gbit
SRC=gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=43us
.venv/bin/tracetool replay "$OUT/netlab_store" --source-network "$SRC"
.venv/bin/tracetool replay "$OUT/netlab_store" --source-network "$SRC" \
    --network inter_node_bw=200Mbit/s --chrome-trace "$OUT/replay/projected_200mbit.json" \
    --plot "$OUT/replay/replay_200mbit.png"
.venv/bin/tracetool sweep "$OUT/netlab_store" --source-network "$SRC" \
    --network inter_node_bw=0.2,0.5,1,2,10Gbit/s --out "$OUT/replay/sweep"
