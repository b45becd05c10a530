#!/usr/bin/env bash
# Create .venv (Python 3.11+) and install tracetool into it; idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${1:-}" 2>&1 \
  | grep -v -E "^WARNING: (Location|Ignoring)" || true
