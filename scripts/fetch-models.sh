#!/usr/bin/env bash
# Build kiln in release mode and fetch every known model into the models directory
# ($KILN_MODELS, else ~/.cache/kiln/models). Already-cached, verified models are skipped,
# so this is cheap to run on every CI job.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin kiln
./target/release/kiln pull --all "$@"
