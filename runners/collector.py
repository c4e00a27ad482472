"""Python's cycle collector off while a rank starts, on again once it trains.

A rank imports torch, DeepSpeed (whose engine brings torch._dynamo and sympy) and
transformers, then builds its model and engine: hundreds of thousands of objects,
nearly all kept for the process's life. With the collector on, its full collections
walk that growing heap again and again while nothing is freed: `import torch,
deepspeed` plus a tiny Llama took 4.7-5.2 CPU-s with it and 3.8-3.9 without on the
2-core box (docs/BENCHMARKS.md, "Rank start-up"), paid by every rank of every run.
Start-up makes little cyclic garbage, so little is kept that a collection would
have freed; ``gc.freeze`` then keeps the training loop's collections off the
start-up's objects too. Only runner scripts call :func:`pause`, never a module a
test imports.
"""

from __future__ import annotations

import gc


def pause() -> None:
    gc.disable()


def resume() -> None:
    """The collector back on (once), with what start-up made set aside for good."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
