#!/usr/bin/env bash
# The test suite: set up, lint, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "[test,ray]"
# the browser test renders report.html in Debian's Chromium (it is skipped without one)
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } \
    >/dev/null 2>&1 || echo "note: could not install chromium; the browser test will be skipped"
fi
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=30 "$@"  # the slowest tests: what to trim when CI grows
