"""Stage 6, *report*: markdown reports, matplotlib charts and CSV/JSON files built from :mod:`dstui.analysis`.

May import core, tracking and analysis. A new report section is a function in
:mod:`dstui.report.markdown` (or a module beside it) fed by analysis results.
"""
