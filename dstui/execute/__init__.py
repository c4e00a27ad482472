"""Stage 3, *execute*: RunSpec -> run folder -> process; the detached supervisor that follows runs.

May import core, spec, revisions and tracking. This is where executors plug in: a new way of
starting a run's processes (Slurm, ...) goes beside :mod:`dstui.execute.launch`.
"""
