"""Example loopstudy plugins (docs/extending.md): `momentum`, a carry rule with one hyperparameter, and `reverse`, a
task of variable length."""
