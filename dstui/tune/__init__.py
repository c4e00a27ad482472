"""Stage on top of execute and analysis, *tune*: the fastest DeepSpeed set-up that fits, found with few probes.

``dstui tune SPEC`` expands the spec's ``tune:`` space into candidates
(``candidates``: gradient accumulation derived to keep the global batch, each
invalid or too large one left out with its reason, the memory forecast deciding
what fits), orders them by the time model (:mod:`dstui.analysis.time_fit`,
calibrated on this machine's history and on every probe as it lands), and
measures only those that can still win (``search``, pure) with short probes
(``probe_rules``: warm-up skipped, steps until the step-time interval ranks the
candidate, a hard time box). Probes are runs of one batch, launched and
supervised like any other (``probes``: the one module that talks to the launch
path). ``state`` keeps the search on disk, so a killed `dstui tune` resumes
where it stopped; ``session`` is the loop; ``result`` the ranking, the winner's
spec and what goes to MLflow.

May import core, spec, revisions, tracking, execute, analysis, report.
"""
