"""Training: build a run, step, evaluate, checkpoint, write the run directory (docs/training.md).

Core, what `python train.py` runs, in reading order: schema.py (the typed config), build.py,
step.py (one optimizer step), evaluate.py, checkpoint.py, files.py and run_dir.py (the run
directory), job.py (stop signals, exit codes). Options, loaded only when a config or an event
names them: resume.py (trainer.resume, or a stopped run's resume command), loggers.py
(logger=tensorboard|wandb), overrides.py (the command line's group overrides). Infrastructure,
which no core module imports: launch.py (sweeps under Hydra's launchers, their stop and resume,
SLURM), loaded by the launcher configs' callback and by train.py's entry for a sweep's job.
"""
