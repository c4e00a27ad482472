"""Stage 5, *analysis*: runs read back from MLflow as pandas frames; statistics, parity, revision comparison.

May import core, spec and tracking. No matplotlib (that is :mod:`dstui.report`), no textual.
"""
