"""The `python -m tf_loss_scale demo` command: float32 vs float16 with and without loss scaling.

Modules: `config` (settings), `onednn` (TensorFlow's oneDNN switch, set
before TensorFlow loads), `apis` (which API works here), `data` (digits),
`keras_run`, `experimental_run` and `v1_run` (one training run per API),
`record` (what a run records each step), `measure` (flushed gradients and
their magnitudes), `report` (progress bar, table and the commands to look
further), `results` (a run's results and results.json), `plot` (PNG),
`quiet` (TensorFlow's log to a file), `runner` (the whole demo), `cli`
(the command's arguments).

Each API module has `train(kind, name, config, digits, batches, log_dir,
checkpoint_dir, stream) -> results.RunResult`: it trains and evaluates the
run `kind` (one of `config.KINDS`, shown as `name`) with the settings
`config` on `digits`, taking the training examples of each step from
`batches` (`[steps, batch_size]` indices), writes TensorBoard event files to
`log_dir`, saves the model and optimizer in the API's own checkpoint format
into `checkpoint_dir` unless it is None, and draws its progress bar on
`stream`.
"""
