"""`dstui ui`: the `mlflow ui` command for these runs (bound to 127.0.0.1), and the links to open.

It prints at once: the links name their experiment through the SQLite store
itself, not MLflow's client (whose import and store check took 12.8 s on a
loaded machine). ``--start`` prints the same links, then becomes the server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from dstui.commands import _argtypes
from dstui.core import paths
from dstui.core.credential_text import strip_credentials
from dstui.tracking import chart_view, sqlite_store
from dstui.tracking import client as tracking


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=_argtypes.port, default=5000)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--start", action="store_true", help="start it instead of printing it")
    p.add_argument("--batch", help="the batch whose runs the printed link compares (default: the newest)")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def exposure_warning(host: str, port: int) -> str | None:
    """What to say when the MLflow server would listen beyond this host (issue 33.7); None on loopback."""
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return None
    return (
        f"dstui: warning: --host {host} serves MLflow without authentication: anyone who can reach "
        f"port {port} can read and change every run (MLflow's Host-header check is no login). Safer: "
        f"keep the default 127.0.0.1 and reach it through an SSH tunnel (ssh -L {port}:127.0.0.1:{port} "
        "<this host>), or run MLflow's basic-auth app (mlflow server --app-name basic-auth)."
    )


def run(args: argparse.Namespace) -> int:
    warning = exposure_warning(args.host, args.port)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    argv = tracking.run_ui_command(paths.tracking_uri(), port=args.port, host=args.host)
    base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"  # noqa: S104 - a link, no bind
    if not args.start:
        print(strip_credentials(shlex.join(argv)))
        print()
    else:
        print(f"starting MLflow's UI at {base}/#/experiments?{tracking.UI_MODE} (Ctrl-C stops it)")
    print(f"over SSH: ssh -L {args.port}:127.0.0.1:{args.port} <this host>, "
          f"then open http://127.0.0.1:{args.port}/#/experiments?{tracking.UI_MODE}")  # fmt: skip
    links = batch_links(args.batch, base)
    if links:
        print(f"\nthe experiment's charts, training first (dstui's view): {links[1]}")
        print(f"the batch's runs side by side: {links[0]}")
    if args.start:
        sys.stdout.flush()
        # MLflow's server would make a new store in place, where a kill leaves it half-made: dstui makes it first
        sqlite_store.ensure_store(paths.tracking_uri())
        # the running interpreter's mlflow: works without the venv on PATH
        os.execv(sys.executable, [sys.executable, "-m", "mlflow", *argv[1:]])
    return 0


def batch_links(batch_id: str | None, base: str) -> tuple[str, str] | None:
    """The MLflow UI links comparing a batch's runs (the newest batch by default) and opening its
    experiment's chart view on dstui's saved view; None without a batch that reached MLflow.

    The run ids are the run folders' (status.json); the experiment id is the store's.
    """
    from dstui.core.rundir import list_batches

    batches = list_batches(paths.runs_dir())
    batch = next((b for b in batches if b.id == batch_id), None) if batch_id else (batches[0] if batches else None)
    if batch is None:
        return None
    run_ids = [rid for rd in batch.runs() if (rid := rd.status().get("mlflow_run_id"))]
    if not run_ids:
        return None
    exp = experiment_of(batch.info().get("tracking_uri") or paths.tracking_uri(), run_ids[0])
    if exp is None:
        return None
    return tracking.compare_url(base, exp, run_ids), chart_view.view_url(base, exp)


def experiment_of(uri: str, run_id: str) -> str | None:
    """The run's experiment id: from a local store directly; from a server through MLflow's client."""
    local = sqlite_store.sqlite_path(uri)
    if local is not None:
        return sqlite_store.experiment_of_run(local, run_id) if local.is_file() else None
    try:
        return tracking.client(uri).get_run(run_id).info.experiment_id
    except Exception:  # the server is gone or elsewhere: no link rather than a traceback
        return None
