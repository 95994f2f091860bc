#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit/property/integration tests,
# doc tests, and (when present) the Python driver tests in their own venv.
# This is what CI runs (.ci/run) and what the README's quick start names.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# A clean clone gains nothing from incremental compilation but ~2 GB of
# target/debug/incremental; the debug build needs ~7 GB more. Say how much
# room there is, so a full disk reads as that and not as a linker crash.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL=0
fi
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
avail_kb=$(df -Pk "$target_dir" | awk 'NR == 2 { print $4 }')
if [ -n "$avail_kb" ] && [ "$avail_kb" -lt 10485760 ]; then
    printf 'warning: %s MB free for %s; the debug build and its test binaries need ~8 GB\n' \
        "$((avail_kb / 1024))" "$target_dir" >&2
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
# Property tests use a fixed case count (see each proptest config); the suite
# must stay well under 20 minutes on 2 cores.
# --no-fail-fast and no early exit: one run shows every failing test, Rust
# and Python, and the script still fails at the end. (Running the test
# binaries two at a time saved only ~90 s of ~10 min here, and the replica-set
# simulation, crates/duet-repl/tests/sim.rs, hung under that extra load: they
# run one after another.)
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
    # Two workers (pytest-xdist), each with its own session server: most of
    # these tests wait on servers and replica sets rather than compute, so
    # two run side by side in about half the time even on 2 cores.
    "$venv/bin/python" -m pytest -q -n "${DUET_PYTEST_WORKERS:-2}" tests/python || failed=1
fi
if [ "$failed" -ne 0 ]; then
    printf '\n== FAILED (see above)\n'
    exit 1
fi
