"""Turn a RunSpec into an argv, an environment and a run folder, and start it.

Every run is an argv list started in its own process session (so the whole
job — launcher and ranks — is one process group that can be killed at once
and does not die with the terminal). Nothing is ever passed through a shell:
values from a spec cannot inject commands.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from dstui.core import names, paths, proc_identity, run_status, secrets, shm
from dstui.core.credential_text import MASK
from dstui.core.paths import RUNNERS_DIR
from dstui.core.rundir import PRIVATE_SPEC_FILE, RunDir, read_json, write_json_atomic
from dstui.execute import bytecode, cwd_link, process_group
from dstui.spec import flags
from dstui.spec.experiment import RunSpec
from dstui.spec.settings import Settings

# The settings a bundled runner takes (as --dash-form flags) are declared on the Settings
# model; dstui.spec.flags turns them into its argv.
RUNNER_SCRIPTS = {"train": RUNNERS_DIR / "train.py", "verify": RUNNERS_DIR / "compare_loss.py"}



_HANDED_OUT: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux; the usual default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A master port for a new job, free now and unlikely to be taken before the job binds it.

    The launcher binds the port 10-20 s after it is chosen (DeepSpeed imports
    first). A port from the kernel's ephemeral range (what binding port 0 hands
    out) can meanwhile become the local end of any outgoing connection on the
    host (gloo and NCCL open many), and the job then dies with "address already
    in use". So: a random free port below that range, never one this process
    already handed out (runs launched side by side), and never one whose
    DeepSpeed CPU all-reduce buffers a dead job left in /dev/shm (they are named
    by port, and a new job would map the stale ones).
    """
    rng = rng or random.Random()
    low, _ = ephemeral_range()
    top = max(low, 11024)
    for _ in range(200):
        port = rng.randrange(top - 10000, top)
        if port not in _HANDED_OUT and not shm.buffers_of_port(port) and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded host: any free port
        s.bind(("", 0))
        return int(s.getsockname()[1])


def launcher_args(s: Settings, *, port: int, gpu_slice: list[int] | None = None) -> list[str]:
    """Arguments of DeepSpeed's own launcher (single node or via its multi-node backends)."""
    lc = s.launcher
    args: list[str] = []
    if lc.hostfile:
        args += ["--hostfile", lc.hostfile]
    if lc.launcher:
        args += ["--launcher", lc.launcher]
    if lc.master_addr:
        args += ["--master_addr", lc.master_addr]
    args += ["--master_port", str(lc.master_port or port)]
    include = lc.include
    if gpu_slice is not None and not include:
        include = "localhost:" + ",".join(str(g) for g in gpu_slice)
    if include or lc.exclude:
        # DeepSpeed refuses --num_gpus/--num_nodes together with include/exclude.
        if include:
            args += ["--include", include]
        if lc.exclude:
            args += ["--exclude", lc.exclude]
    else:
        if s.nodes > 1:
            args += ["--num_nodes", str(s.nodes)]
        args += ["--num_gpus", str(s.gpus)]
    return args + list(lc.extra_args)


def substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Fill {metrics_file}-style placeholders in a user command, element by element."""
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def build_argv(
    run: RunSpec,
    rd: RunDir,
    *,
    python: str | None = None,
    port: int | None = None,
    gpu_slice: list[int] | None = None,
) -> list[str]:
    s = run.settings
    port = port or free_port()
    python = python or sys.executable
    if s.kind == "command":
        assert s.command is not None
        return substitute(
            list(s.command),
            {
                "metrics_file": str(rd.metrics_file),
                "ds_config": str(rd.ds_config_file),
                "run_dir": str(rd.path),
                "master_port": str(port),
                "python": python,
            },
        )
    runner = script_args(run, rd)
    if starts_ranks_directly(s):
        return [*direct_ranks_args(s, port=port, gpu_slice=gpu_slice), python, *runner]
    return [
        python, "-m", "deepspeed.launcher.runner",
        *launcher_args(s, port=port, gpu_slice=gpu_slice),
        *runner,
    ]  # fmt: skip


def script_args(run: RunSpec, rd: RunDir) -> list[str]:
    """A bundled runner and its arguments: what every rank runs (after the python executable)."""
    s = run.settings
    return [
        str(RUNNER_SCRIPTS[s.kind]),
        *flags.argv_of(s, s.kind),
        "--ds-config", str(rd.ds_config_file),
        "--metrics-file", str(rd.metrics_file),
        *s.extra_args,
    ]  # fmt: skip


# DSTUI_RANK_LAUNCHER=deepspeed (in the environment or a condition's `env`) keeps
# DeepSpeed's launcher for single-node runs too: the old path, for comparison.
RANK_LAUNCHER_ENV = "DSTUI_RANK_LAUNCHER"
_LOCAL_HOSTS = (None, "127.0.0.1", "localhost")


def starts_ranks_directly(s: Settings) -> bool:
    """Whether dstui starts the ranks itself (dstui.execute.injob.ranks) instead of DeepSpeed's launcher.

    Only where DeepSpeed's launcher would take its single-node path with
    nothing but rank start-up to do: one node, no hostfile, no multi-node
    backend, no host filters and no launcher arguments dstui cannot mirror.
    """
    lc = s.launcher
    wanted = s.env.get(RANK_LAUNCHER_ENV) or os.environ.get(RANK_LAUNCHER_ENV) or "dstui"
    return (
        wanted != "deepspeed"
        and s.nodes == 1
        and not (lc.hostfile or lc.launcher or lc.include or lc.exclude or lc.extra_args)
        and lc.master_addr in _LOCAL_HOSTS
    )


def direct_ranks_args(s: Settings, *, port: int, gpu_slice: list[int] | None) -> list[str]:
    """``python -m dstui.execute.injob.ranks`` with the rank count, port and devices; the rank command follows."""
    devices = list(gpu_slice) if gpu_slice is not None else list(range(s.gpus))
    return [
        sys.executable, "-m", "dstui.execute.injob.ranks",
        "--nproc", str(len(devices)),
        "--master-port", str(s.launcher.master_port or port),
        "--devices", ",".join(str(d) for d in devices),
        "--",
    ]  # fmt: skip


def build_env(
    run: RunSpec, rd: RunDir, base: dict[str, str] | None = None, revision: dict | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    rev_env = (revision or {}).get("env_dir")
    if rev_env:
        # each revision compiles its JIT ops into its own cache (see revisions.run_env)
        env["TORCH_EXTENSIONS_DIR"] = str(Path(rev_env) / "torch_extensions")
    for name, folder in compile_cache_dirs(rev_env, python=(revision or {}).get("python")).items():
        env.setdefault(name, folder)  # a user's own cache setting wins
    env = bytecode.apply(env, env_dir=rev_env)
    env.update(run.settings.env)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "DSTUI_RUN_DIR": str(rd.path),
            "DSTUI_METRICS_FILE": str(rd.metrics_file),
            "DSTUI_DS_CONFIG": str(rd.ds_config_file),
            "DSTUI_RUN_KEY": run.key,
        }
    )
    return env


def compile_cache_dirs(rev_env: str | None, *, python: str | None = None) -> dict[str, str]:
    """Persistent torch.compile caches for a run: Inductor/AOTAutograd (FX graph, autotuning) and Triton.

    By default Inductor caches under /tmp/torchinductor_<user> (gone after a
    reboot, shared by every torch and DeepSpeed build) and Triton under
    ~/.triton. A folder per revision environment keeps a revision's compiled
    kernels apart from another's and reusable by the next run or batch of the
    same revision; runs without a revision share one folder per Python.
    """
    if rev_env:
        root = Path(rev_env) / "compile_cache"
    else:
        import hashlib

        tag = hashlib.sha1(str(Path(python or sys.executable).absolute()).encode()).hexdigest()[:12]
        root = paths.cache_dir() / "compile_cache" / tag
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}


def prepare(batch_path: Path, run: RunSpec, ds_config: dict, *, revision: dict | None = None) -> RunDir:
    """Create the run folder with everything known before launch; state 'queued'."""
    rd = RunDir(names.child_path(batch_path, run.name))
    secrets.private_dir(rd.path)
    spec = run.model_dump(mode="json")
    spec.update(name=run.name, key=run.key, revision_info=revision or {})
    shown = secrets.redact(spec)
    write_json_atomic(rd.spec_file, shown)
    # the real values, readable by this user only, outside the run folder, for the launch
    secrets.keep_private(rd.path, spec if shown != spec else None)
    write_json_atomic(rd.ds_config_file, ds_config)
    if not rd.status_file.exists():
        run_status.queued(rd, name=run.name, condition=run.condition, revision=run.revision, repeat=run.repeat,
                          key=run.key, order=run.order, steps_total=run.settings.steps)  # fmt: skip
    return rd


def load_runspec(rd: RunDir) -> RunSpec:
    """The run as prepared, with the real env values (never the masked ones of spec.json)."""
    data = secrets.read_private(rd.path) or read_json(rd.path / PRIVATE_SPEC_FILE) or json.loads(rd.spec_file.read_text())
    run = RunSpec.model_validate({k: data[k] for k in RunSpec.model_fields if k in data})
    secrets.remember(run.settings.env, run.settings.env_visible)
    return run


class PrivateValuesMissing(OSError):
    """A run whose real env values are gone: it is not started with ``***`` in their place."""


def check_real_env(run: RunSpec, rd: RunDir) -> None:
    masked = sorted(n for n, v in run.settings.env.items() if v == MASK)
    if masked:
        raise PrivateValuesMissing(
            f"the real values of env {', '.join(masked)} are gone ({rd.private_spec_file} is missing); "
            "prepare the run again with `dstui run --resume SPEC`"
        )


def shown_command(run: RunSpec, argv: list[str]) -> list[str]:
    """The argv as cmd.txt, status.json and the terminal show it (core.secrets.mask_argv).

    No credentials, no hidden env value, no value of a secret-named flag or
    token shape; ``{env:NAME}`` stays a reference.
    """
    env = run.settings.env
    hidden = [env[n] for n in secrets.hidden_names(env, run.settings.env_visible)]
    return secrets.mask_argv(argv, hidden)


class EnvRefMissing(OSError):
    """A command names ``{env:NAME}`` and NAME is set neither in the spec's env nor where dstui runs."""


def real_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """What the process gets: ``{env:NAME}`` references replaced by their values (never written down)."""
    try:
        return secrets.resolve_env_refs(argv, env)
    except secrets.MissingEnvRef as e:
        raise EnvRefMissing(str(e)) from None


def start(
    run: RunSpec,
    rd: RunDir,
    *,
    python: str | None = None,
    gpu_slice: list[int] | None = None,
    cwd: str | None = None,
    revision: dict | None = None,
) -> subprocess.Popen:
    """Start the run in a new session; stdout+stderr of all ranks go to stdout.log.

    The job runs under :mod:`dstui.execute.injob.wrap`, which records its exit status in
    the run folder, so a restarted supervisor still learns how it ended.
    """
    check_real_env(run, rd)
    argv = build_argv(run, rd, python=python, gpu_slice=gpu_slice)
    shown_argv = shown_command(run, argv)
    env = build_env(run, rd, revision=revision)
    argv = real_argv(argv, env)
    rd.cmd_file.write_text(shlex.join(shown_argv) + "\n")
    rd.exit_file.unlink(missing_ok=True)
    if cwd is None:  # a bundled runner in its run folder, named by a path the GPU kernel cache knows again
        env.update(cwd_link.env_for(rd.path, gpu_slice))
    if run.settings.kind == "command" and gpu_slice is not None and "CUDA_VISIBLE_DEVICES" not in run.settings.env:
        # a program of its own sees only the GPUs the supervisor gave it (ranks get theirs from ranks.py)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_slice)
    # every process of the job inherits it, also one that leaves the job's session: cancel finds them all
    token = proc_identity.new_token()
    env[proc_identity.JOB_TOKEN_ENV] = token
    with open(rd.log_file, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dstui.execute.injob.wrap", str(rd.path), "--", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd or str(rd.path),
            start_new_session=True,
            close_fds=True,
            umask=secrets.user_umask(),  # dstui's files are private; the job's are as its user wants
        )
    run_status.running(
        rd,
        # the leader's start and the boot beside its number: signals reach the job, never a newcomer
        **process_group.record(proc.pid, token),
        started=time.time(),
        argv=shown_argv,
        gpu_slice=gpu_slice,
    )
    return proc
