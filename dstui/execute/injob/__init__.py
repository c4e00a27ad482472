"""The programs that run inside a job, not in the supervisor: each started with ``python -m``.

* :mod:`~dstui.execute.injob.wrap` — the session leader of every job: starts it,
  records ``exit.json``, wakes a supervisor for an orphaned batch;
* :mod:`~dstui.execute.injob.ranks` — starts a single-node job's ranks with the
  environment DeepSpeed's launcher gives them;
* :mod:`~dstui.execute.injob.slurm_rank` — one rank of a Slurm job (Slurm's task
  variables in DeepSpeed's names, its placement in ``ranks/``);
* :mod:`~dstui.execute.injob.node_sampler` — system readings of one node of a
  Slurm job into ``nodes/<node>.jsonl``.

They start once per job, rank or node, so they stay small and quick to import:
the standard library and a few stdlib-only helpers of dstui (``core.rundir``'s
file names, ``core.secrets``, ``core.startup_trace``, ``execute.bytecode``);
``node_sampler`` also reads psutil/NVML through ``execute.sysmetrics``. Nothing
here imports the supervisor's modules, the spec models or MLflow, and what
starts them (argv building in ``execute.launch``, ``job.sh`` in
``execute.backends.slurm_script``) names them by these module paths.
"""
