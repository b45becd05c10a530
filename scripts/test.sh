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
# two workers, a test file each at a time (its module fixtures stay in one process): 6-10 min
# here (idle / loaded) against 13.5 one after the other; the 30 slowest tests say what to trim when CI grows
.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=30 "$@"
