"""Foundations every stage shares: errors, paths, safe names, the run-folder layout and the metrics record.

Stage 0 of the data flow. Imports nothing else from dstui; nothing heavy (no torch,
deepspeed, mlflow, textual) at module level, so runners and the CLI can use it cheaply.
"""
