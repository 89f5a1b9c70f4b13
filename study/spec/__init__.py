"""The study spec: one YAML file of a base trial and a sweep, validated (`schema`) and expanded into trial configs
(`study`), where its Optuna search is stored (`optuna_location`), and which stored trials belong to it
(`membership`). Torch-free and Ray-free."""

from study.spec.study import Study, load_saved_study, load_study, saved_spec, study_from_data

__all__ = ["Study", "load_saved_study", "load_study", "saved_spec", "study_from_data"]
