"""Use cases: one service per thing a person does with dstui, shared by every face.

The CLI (:mod:`dstui.commands`) and the TUI (:mod:`dstui.tui`) render and ask;
the work between them and the stages lives here, once, so the two faces can
never drift apart. ``results`` loads runs -> histories -> statistics ->
conditions -> baseline -> ratios for ``dstui report``, ``dstui compare`` and
the Results screen; ``report`` writes a report from those results and logs it
to MLflow.

May import every stage below the faces (never ``commands`` or ``tui``).
"""
