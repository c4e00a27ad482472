"""Stage 4, *tracking*: the MLflow client dstui writes and reads through (batching, tags, lookups).

May import :mod:`dstui.core` only; mlflow itself is imported inside functions.
"""
