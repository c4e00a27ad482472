"""The exit status of every dstui command, defined once (the CLI's --help prints :data:`HELP`).

Scripts branch on these, so they mean the same for every command: 0 when the
work is done, 1 when it ran but a run failed or was cancelled, 2 when the input
was wrong (nothing was done), 3 when what was asked for does not exist.
"""

from __future__ import annotations

OK = 0  # done: every run of the batch done (or skipped), the command did its work
RUN_FAILED = 1  # a run failed or was cancelled (run, status); the command's own "no" (bisect ambiguous, import of nothing)
BAD_INPUT = 2  # bad arguments or spec, refused request; nothing was changed
NOT_FOUND = 3  # no such batch or run, no batches at all, a pattern that matches nothing
INTERRUPTED = 130  # Ctrl-C (the runs go on)

HELP = """\
exit status (the same for every command):
  0    done: every run done (or skipped), or the command did its work (status without
       --follow: no run failed or was cancelled so far; --follow waits for the end)
  1    a run failed or was cancelled (run, status); bisect: ambiguous; import: nothing imported
  2    bad input: arguments, spec or request refused; nothing was changed
  3    nothing found: no such batch or run, no batches, a pattern that matches nothing
  130  interrupted (Ctrl-C); runs go on in the background"""
