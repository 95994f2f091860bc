#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit/property/integration tests,
# doc tests, and (when present) the Python driver tests in their own venv.
# This is what CI runs (.ci/run) and what the README's quick start names.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
# Property tests use a fixed case count (see each proptest config); the suite
# must stay well under 20 minutes on 2 cores.
# --no-fail-fast and no early exit: one run shows every failing test, Rust
# and Python, and the script still fails at the end.
failed=0
cargo test --workspace --locked --no-fail-fast || failed=1

if [ -d tests/python ]; then
    step "python driver tests"
    venv=".venv"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements.txt
    # `cargo test --workspace` above already built target/debug/duet (with the
    # test run's unified features); building it again alone would recompile
    # half the dependency tree with other features.
    [ -x target/debug/duet ] || cargo build --locked -p duet
    "$venv/bin/python" -m pytest -q tests/python || failed=1
fi
if [ "$failed" -ne 0 ]; then
    printf '\n== FAILED (see above)\n'
    exit 1
fi
