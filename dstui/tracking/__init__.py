"""Stage 4, *tracking*: the MLflow client dstui writes and reads through (batching, tags, lookups),
and dstui's MLflow layout (:mod:`~dstui.tracking.layout`, :mod:`~dstui.tracking.metric_names`,
:mod:`~dstui.tracking.chart_view`).

May import :mod:`dstui.core` only; mlflow itself is imported inside functions.
"""
