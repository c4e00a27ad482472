"""dstui: compose, launch, watch, track and report DeepSpeed experiments.

The package root stays import-light on purpose: the TUI must draw its first
frame fast, so nothing here pulls in torch, deepspeed, mlflow or textual.
"""

__version__ = "0.1.0"
