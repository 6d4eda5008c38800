"""The `python -m tf_loss_scale demo` command: float32 vs float16 with and without loss scaling.

Modules: `config` (settings), `data` (digits), `keras_run` and `v1_run` (one
training run per API), `measure` (flushed gradients), `report` (progress bar
and table), `plot` (PNG), `runner` (the whole demo).
"""
