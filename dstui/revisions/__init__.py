"""Stage 2, *revisions*: resolve each DeepSpeed revision to an isolated, cached Python env.

May import :mod:`dstui.core` and :mod:`dstui.spec`. Never writes the user's environment.
"""
