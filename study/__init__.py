"""loopstudy: distributed ablation studies of looped-transformer reasoners."""

__version__ = "0.1.0"
