#!/usr/bin/env bash
# The CPU showcase (issue: README "Results"): three studies on the embedded Ray, then the tables and figures the
# README shows, regenerated from the stored Parquet alone. About 45-60 minutes on 2 cores (see the specs' notes).
# Interrupted? Run it again: trials complete in storage are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${STORE:-results/showcase}
for spec in depth_scaling axis_placement beta_init; do
  loopstudy run "search_spaces/cpu/$spec.yaml" --storage "$STORE" --no-plot
done
loopstudy table depth --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table stability --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table perturbation --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table final --study cpu_axis_placement --store "$STORE" --format markdown
loopstudy table final --study cpu_beta_init --store "$STORE" --format markdown
loopstudy plot all --study cpu_depth_scaling --store "$STORE" --out docs/figures
