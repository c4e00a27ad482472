"""Side entry, *import*: logs written by the seeds' scripts (and dstui's own records) into MLflow runs.

May import core and tracking; it feeds the same MLflow layout the supervisor writes.
"""
