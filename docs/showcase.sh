#!/usr/bin/env bash
# The CPU showcase (docs/results.md): every study on the page, on the embedded Ray, then every table and figure the
# page shows, from the stored Parquet alone, in the page's order. Wall times on 2 cores are on the page beside each
# study: about six hours in all; the published models' four studies come first and take about three (the paired
# overthinking study another hour and a half).
# Interrupted? Run it again: trials and readings complete in storage are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${STORE:-results/showcase}
S=(--store "$STORE")
M=(--format markdown)

# -- First: does the published TRM learn here? (TRM-Att's factors, learning curves paired by seed) --------------------
loopstudy run search_spaces/cpu/trm_factors.yaml "${S[@]}" --no-plot
# the trained settings only (the readings of their checkpoints below are settings of their own)
FACTORS=(trm_att_adamw trm_att_conv trm_att_learned_pos trm_att_no_act trm_att_no_prefix trm_att_nsup16
         trm_att_pos_init_prefix trm_att_softmax trm_att_torch_init trm_like trm_like_act trm_mlp)
loopstudy table compare --study cpu_trm_factors "${S[@]}" --baseline trm_att --settings "${FACTORS[@]}" --depth 48 \
  "${M[@]}"
loopstudy evaluate cpu_trm_factors --checkpoints "eval.depths=[48]" "${S[@]}" --no-plot
loopstudy table checkpoints --study cpu_trm_factors "${S[@]}" --wide "${M[@]}"
loopstudy table depth --study cpu_trm_factors "${S[@]}" --wide "${M[@]}"
loopstudy plot checkpoints --study cpu_trm_factors "${S[@]}" --figures docs/figures
loopstudy run search_spaces/cpu/trm_factors_added.yaml "${S[@]}" --no-plot  # the other direction
loopstudy table compare --study cpu_trm_factors_added "${S[@]}" --baseline trm_like --depth 48 "${M[@]}"

# -- The published models with each carry rule, read to 24,960 layers in bf16 ------------------------------------------
loopstudy run search_spaces/cpu/published_rules.yaml "${S[@]}" --no-plot
RULES=()  # the trained settings (the readouts below add settings of their own)
for arch in trm_att trm_mlp; do for rule in carry_last damped infiloop; do RULES+=("$arch rule=$rule"); done; done
loopstudy table depth --study cpu_published_rules "${S[@]}" --wide "${M[@]}"
loopstudy plot depth --study cpu_published_rules "${S[@]}" --settings "${RULES[@]}" --figures docs/figures
for arch in trm_att trm_mlp; do
  for depth in 48 24960; do
    loopstudy table compare --study cpu_published_rules "${S[@]}" --baseline "$arch rule=carry_last" \
      --settings "$arch rule=infiloop" "$arch rule=damped" --depth "$depth" "${M[@]}"
  done
done
# each rule's 24,960-layer reading minus its 48-layer one, per seed
DEEP_MINUS_48="select label, \"model.carry.rule\" as rule, seed,
  max(exact_acc) filter (where depth_layers = 24960) - max(exact_acc) filter (where depth_layers = 48) as deep_minus_48
  from depth_eval join trials using (trial_id)
  where trials.study = 'cpu_published_rules' and weights_of is null and difficulty is null group by all order by all"
loopstudy query "${S[@]}" "$DEEP_MINUS_48" "${M[@]}"
# halting readouts of the same weights: TRM's Q head and FPRM's residual rule; then the dynamics readout
loopstudy evaluate cpu_published_rules eval.halting=true eval.halting_rule=q_head "eval.depths=[12,48,192,468,1872]" "${S[@]}" --no-plot
loopstudy evaluate cpu_published_rules eval.halting=true "eval.depths=[12,48,192,468,1872]" "${S[@]}" --no-plot
loopstudy evaluate cpu_published_rules "eval.stability=[36,72]" eval.perturb_update=36 "eval.depths=[468,1872]" "${S[@]}" --no-plot
loopstudy table halting --study cpu_published_rules "${S[@]}" "${M[@]}"
D="depths=[12, 48, 192, 468, 1872]"
FRONT=()
for rule in carry_last damped infiloop; do  # each halting readout minus the same weights run to depth
  loopstudy table compare --study cpu_published_rules "${S[@]}" --baseline "trm_att rule=$rule" \
    --settings "trm_att rule=$rule $D halting=true" "trm_att rule=$rule $D halting=true halting_rule=q_head" \
    --depth 1872 "${M[@]}"
  FRONT+=("trm_att rule=$rule" "trm_att rule=$rule $D halting=true" "trm_att rule=$rule $D halting=true halting_rule=q_head")
done
loopstudy table pareto --study cpu_published_rules "${S[@]}" "${M[@]}"
loopstudy table pareto --study cpu_published_rules "${S[@]}" --settings "${FRONT[@]}" "${M[@]}"  # TRM-Att's front
loopstudy plot pareto --study cpu_published_rules "${S[@]}" --settings "${FRONT[@]}" --figures docs/figures
loopstudy table stability --study cpu_published_rules "${S[@]}" "${M[@]}"
loopstudy table perturbation --study cpu_published_rules "${S[@]}" "${M[@]}"

# -- InfiLoop's ablations on the published TRM-MLP, 5 seeds paired ------------------------------------------------------
loopstudy run search_spaces/cpu/published_infiloop.yaml "${S[@]}" --no-plot
loopstudy table depth --study cpu_published_infiloop "${S[@]}" --wide "${M[@]}"
ABLATIONS=(inner outer both_H4L2 learned_0.10 learned_0.90 fixed_0.55 uniform_1.0 reverse_1.82)
for depth in 48 1872; do
  loopstudy table compare --study cpu_published_infiloop "${S[@]}" --baseline both --settings "${ABLATIONS[@]}" \
    --depth "$depth" "${M[@]}"
done
loopstudy evaluate cpu_published_infiloop --checkpoints "eval.depths=[48]" "${S[@]}" --no-plot
loopstudy table checkpoints --study cpu_published_infiloop "${S[@]}" --wide "${M[@]}"
for step in 80 120; do  # along training, paired by seed
  loopstudy table compare --study cpu_published_infiloop "${S[@]}" --baseline "both depths=[48]" --step "$step" \
    --depth 48 "${M[@]}"
done
loopstudy plot checkpoints --study cpu_published_infiloop "${S[@]}" --figures docs/figures

# -- loopstudy's TRM-like reasoner: depth scaling, FPRM's tau, the compute front ---------------------------------------
for spec in depth_scaling halting_tau; do
  loopstudy run "search_spaces/cpu/$spec.yaml" "${S[@]}" --no-plot
done
loopstudy table depth --study cpu_depth_scaling "${S[@]}" --wide "${M[@]}"
loopstudy plot depth --study cpu_depth_scaling "${S[@]}" --figures docs/figures
loopstudy table compare --study cpu_depth_scaling "${S[@]}" --baseline trm_carry_last --depth 24960 "${M[@]}"
loopstudy table compare --study cpu_depth_scaling "${S[@]}" --baseline fprm --depth 24960 "${M[@]}"
loopstudy table halting --study cpu_depth_scaling "${S[@]}" "${M[@]}"
loopstudy table stability --study cpu_depth_scaling "${S[@]}" "${M[@]}"
loopstudy table perturbation --study cpu_depth_scaling "${S[@]}" "${M[@]}"
loopstudy table halting --study cpu_halting_tau "${S[@]}" "${M[@]}"
loopstudy table difficulty --study cpu_halting_tau "${S[@]}" "${M[@]}"
for study in cpu_depth_scaling cpu_halting_tau; do
  loopstudy table pareto --study "$study" "${S[@]}" "${M[@]}"
  loopstudy plot pareto --study "$study" "${S[@]}" --figures docs/figures
done

# -- Overthinking: prefix sums without recall, then the paired retention study ----------------------------------------
loopstudy run search_spaces/cpu/overthinking.yaml "${S[@]}" --no-plot
loopstudy table retention --study cpu_overthinking "${S[@]}" "${M[@]}"
loopstudy table overthinking --study cpu_overthinking "${S[@]}" --paper --wide "${M[@]}"
loopstudy plot overthinking --study cpu_overthinking "${S[@]}" --figures docs/figures
loopstudy run search_spaces/cpu/overthinking_paired.yaml "${S[@]}" --no-plot
loopstudy table compare --study cpu_overthinking_paired "${S[@]}" --baseline carry_last_no_recall --retention \
  --half-width 0.15 "${M[@]}"
for depth in 16 160; do
  loopstudy table compare --study cpu_overthinking_paired "${S[@]}" --baseline carry_last_no_recall --depth "$depth" \
    "${M[@]}"
done
loopstudy table retention --study cpu_overthinking_paired "${S[@]}" "${M[@]}"

# -- Train once, read many times; ARC-AGI's 10x10 subset ----------------------------------------------------------------
loopstudy run search_spaces/cpu/checkpoints.yaml "${S[@]}" --no-plot  # train once, keep checkpoints
loopstudy evaluate cpu_checkpoints --checkpoints "${S[@]}" --no-plot   # ... read every one, no training
loopstudy plot checkpoints --study cpu_checkpoints "${S[@]}" --figures docs/figures
loopstudy run search_spaces/cpu/arc_small.yaml "${S[@]}" --no-plot
loopstudy table depth --study cpu_arc_small "${S[@]}" --wide "${M[@]}"  # pass@2 per puzzle
loopstudy table depth --study cpu_arc_small "${S[@]}" --wide cell_acc "${M[@]}"
loopstudy plot depth --study cpu_arc_small "${S[@]}" --figures docs/figures
