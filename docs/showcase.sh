#!/usr/bin/env bash
# The CPU showcase (docs/results.md): eight studies on the embedded Ray, then the tables and figures docs/results.md
# shows, regenerated from the stored Parquet alone. About three and a half hours on 2 cores (the depth study is 35
# minutes of it, the overthinking study 40, ARC's 10x10 subset 26, the checkpoint study 3, the published TRM's
# factors about 50).
# Interrupted? Run it again: trials complete in storage are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${STORE:-results/showcase}
for spec in depth_scaling axis_placement beta_init halting_tau overthinking arc_small; do
  loopstudy run "search_spaces/cpu/$spec.yaml" --store "$STORE" --no-plot
done
loopstudy table depth --study cpu_depth_scaling --store "$STORE" --wide --format markdown
loopstudy table halting --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table stability --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table perturbation --study cpu_depth_scaling --store "$STORE" --format markdown
loopstudy table placement --study cpu_axis_placement --store "$STORE" --format markdown
loopstudy table beta --study cpu_beta_init --store "$STORE" --format markdown
loopstudy table halting --study cpu_halting_tau --store "$STORE" --format markdown
loopstudy plot all --study cpu_depth_scaling --store "$STORE" --figures "$STORE/figures"
loopstudy plot depth --study cpu_depth_scaling --store "$STORE" --figures docs/figures  # the figure docs/results.md shows
loopstudy table retention --study cpu_overthinking --store "$STORE" --format markdown
loopstudy table overthinking --study cpu_overthinking --store "$STORE" --paper --wide --format markdown
loopstudy plot overthinking --study cpu_overthinking --store "$STORE" --figures docs/figures  # the figure docs/results.md shows
loopstudy run search_spaces/cpu/checkpoints.yaml --store "$STORE" --no-plot  # train once, keep checkpoints
loopstudy evaluate cpu_checkpoints --checkpoints --store "$STORE" --no-plot   # ... read every one, no training
loopstudy plot checkpoints --study cpu_checkpoints --store "$STORE" --figures docs/figures  # the figure docs/results.md shows
# The published TRM-Att at CPU scale, each factor reverted alone, learning curves paired by seed (about 45 minutes)
loopstudy run search_spaces/cpu/trm_factors.yaml --store "$STORE" --no-plot
loopstudy table compare --study cpu_trm_factors --store "$STORE" --baseline trm_att --depth 48 --format markdown
loopstudy evaluate cpu_trm_factors --checkpoints "eval.depths=[48]" --store "$STORE" --no-plot
loopstudy table checkpoints --study cpu_trm_factors --store "$STORE" --wide --format markdown
loopstudy table depth --study cpu_trm_factors --store "$STORE" --wide --format markdown
loopstudy plot checkpoints --study cpu_trm_factors --store "$STORE" --figures docs/figures  # the figure docs/results.md shows
loopstudy run search_spaces/cpu/trm_factors_added.yaml --store "$STORE" --no-plot  # the other direction (6 minutes)
loopstudy table compare --study cpu_trm_factors_added --store "$STORE" --baseline trm_like --depth 48 --format markdown
loopstudy table depth --study cpu_arc_small --store "$STORE" --wide --format markdown  # pass@2 per puzzle
loopstudy table depth --study cpu_arc_small --store "$STORE" --wide cell_acc --format markdown
loopstudy plot depth --study cpu_arc_small --store "$STORE" --figures docs/figures  # the figure docs/results.md shows
