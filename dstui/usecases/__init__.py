"""Use cases: one service per thing a person does with dstui, shared by every face.

The CLI (:mod:`dstui.commands`) and the TUI (:mod:`dstui.tui`) render and ask;
the work between them and the stages lives here, once, so the two faces can
never drift apart (they never import ``dstui.execute``: tests/unit/test_architecture.py).

- ``launch``: plan, checks (the backend's preflight, the forecast with history,
  feasibility), previews, start (create or resume, predicted-OOM skips, notes,
  the supervisor) for `dstui run`, `dstui list`, `dstui demo`, bisect and the TUI;
- ``watch``: one batch watcher (run changes, troubles, notes, the end);
- ``takeover``: the one rule for starting a batch's supervisor;
- ``control``: cancel and retry; ``draft_check``: Compose's check of a spec being edited;
- ``results``: runs -> histories -> statistics -> conditions -> baseline -> ratios for
  ``dstui report``, ``dstui compare`` and the Results screen; ``report`` writes a report
  from those results and logs it to MLflow.

May import every stage below the faces but bisect (which launches through ``launch``);
never ``commands`` or ``tui``. Nothing heavy at module level (the TUI's start path
imports :mod:`.options`).
"""
