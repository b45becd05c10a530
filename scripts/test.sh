#!/usr/bin/env bash
# The test suite: set up, lint, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "[test,ray]"
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
