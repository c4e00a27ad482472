"""Stage 3, *execute*: RunSpec -> run folder -> process; the detached supervisor that follows runs.

May import core, spec, revisions and tracking. Where runs start is an executor backend
(:mod:`dstui.execute.backends`: this machine's process groups, Slurm jobs, or one registered in
:mod:`dstui.core.executors`); the programs that run inside a job are :mod:`dstui.execute.injob`.
"""
