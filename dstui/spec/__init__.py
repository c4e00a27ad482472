"""Stage 1, *spec*: typed experiment specs, matrix expansion into RunSpecs, DeepSpeed config generation.

May import :mod:`dstui.core` only. Runners import this package to share the Settings model.
"""
