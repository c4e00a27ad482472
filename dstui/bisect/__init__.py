"""Stage on top of execute and analysis, *bisect*: find the commit that moved a metric.

``dstui bisect`` lists the first-parent commits between a good and a bad ref,
builds a cached env per tested commit (:mod:`dstui.revisions`), runs one
condition there through the ordinary batch + supervisor path
(:mod:`dstui.execute`), decides good/bad with the statistics of
``dstui compare`` (:mod:`dstui.analysis.revision_compare`) and narrows to the
first bad commit. The same search walks PyPI releases (``releases``: the
package index's list between two versions, then the commits between their
tags). Modules: ``search`` (which commit next, pure), ``decide``
(good/bad/skip from samples: statistics, the runs' own verify/sp-check
verdict, or any recorded metric against a threshold), ``store`` (per-commit results on disk: what makes
a killed bisect resumable), ``measure`` (build + run one commit), ``session``
(the loop), ``report`` (markdown).

May import core, spec, revisions, tracking, execute, analysis, report.
"""
