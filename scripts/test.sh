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
# two workers, a test file each at a time (its module fixtures stay in one process), the
# slowest files first (tests/conftest.py SLOW_FIRST; --no-loadscope-reorder keeps that order
# instead of xdist's by number of tests, which started the 1-test fuzz file last); stores
# several files read are built once per session (conftest shared_store). 15:54 on an idle
# machine, 2026-12-03 21:32 (29:53 CPU): over the 10-minute budget, issue 30;
# the 30 slowest tests say what to trim
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30 "$@"
