#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz.rs for SECONDS each (default 60), one after another, and prints
# each target's execution count. A crash leaves its input in target/fuzz-crashes/.
#   fuzz/run.sh 3600                 # an hour per target
#   REAGENT_FUZZ_SEED=7 fuzz/run.sh  # another mutation sequence
set -euo pipefail
cd "$(dirname "$0")/.."
REAGENT_FUZZ_SECONDS="${1:-60}" cargo test --release --test fuzz -- --nocapture --test-threads 1 2>&1 \
  | grep -E "executions|panicked|test result"
