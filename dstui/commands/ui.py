"""`dstui ui`: the `mlflow ui` command for these runs (bound to 127.0.0.1)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from dstui.core import paths
from dstui.core.secrets import strip_credentials
from dstui.tracking import client as tracking


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--start", action="store_true", help="start it instead of printing it")


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
    if args.start:
        # the running interpreter's mlflow: works without the venv on PATH
        os.execv(sys.executable, [sys.executable, "-m", "mlflow", *argv[1:]])
    print(strip_credentials(shlex.join(argv)))
    print(f"\nover SSH: ssh -L {args.port}:127.0.0.1:{args.port} <this host>, "
          f"then open http://127.0.0.1:{args.port}")  # fmt: skip
    return 0
