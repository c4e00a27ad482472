"""Every spec env value is masked unless allow-listed (issue 20), and the real values stay out of run folders.

Pure functions plus the real writers (launch.prepare, the Slurm job script, the
supervisor's masked output); the whole path through a batch and an MLflow server
is tests/e2e/test_faults_masking.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dstui.core import secrets
from dstui.core.errors import SpecError
from dstui.core.failures import classify
from dstui.core.rundir import RunDir
from dstui.execute import launch
from dstui.execute.backends.slurm_script import job_script
from dstui.spec.expand import expand
from dstui.spec.experiment import RunSpec, SlurmOptions
from dstui.spec.loading import parse_spec
from dstui.spec.settings import Settings

ENV = {"DB_URL": "postgres://u:pass@h/db", "MY_SECRET_THING": "s3cr3t", "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def private_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "private"
    monkeypatch.setenv("DSTUI_PRIVATE_DIR", str(root))
    monkeypatch.setattr(secrets, "_KNOWN", set())  # values a test made this process remember stay in it
    return root


@pytest.mark.parametrize(
    ("name", "visible"),
    [
        ("OMP_NUM_THREADS", True), ("CUDA_VISIBLE_DEVICES", True), ("NCCL_DEBUG", True), ("TORCH_LOGS", True),
        ("PYTORCH_CUDA_ALLOC_CONF", True), ("DS_ACCELERATOR", True), ("HF_HUB_OFFLINE", True),
        ("TOKENIZERS_PARALLELISM", True), ("DSTUI_RANK_LAUNCHER", True),
        ("DB_URL", False), ("MY_SECRET_THING", False), ("HF_TOKEN", False), ("WANDB_API_KEY", False),
        ("MY_FLAG", False), ("TORCH_HUB_TOKEN", False),  # a library prefix does not show a secret-looking name
    ],
)  # fmt: skip
def test_builtin_allow_list(name: str, visible: bool) -> None:
    assert secrets.is_visible(name) is visible


def test_env_visible_names_and_prefixes_show_a_users_own_variables() -> None:
    assert secrets.is_visible("MY_FLAG", ["MY_FLAG"]) and secrets.is_visible("APP_MODE", ["APP_*"])
    assert not secrets.is_visible("MY_FLAG2", ["MY_FLAG"]) and not secrets.is_visible("XAPP_MODE", ["APP_*"])
    assert secrets.mask_env(ENV, ["DB_URL"]) == {"DB_URL": "postgres://***@h/db", "MY_SECRET_THING": "***", "OMP_NUM_THREADS": "1"}


def test_redact_masks_every_env_of_a_spec_dump() -> None:
    """Base settings, a condition's own env, an env axis: env_visible anywhere counts for the spec."""
    spec = {
        "settings": {"env": dict(ENV), "env_visible": ["MY_FLAG"], "command": ["--uri=http://a:b@h"]},
        "conditions": [{"name": "c", "env": {"MY_FLAG": "1", "OTHER": "x"}}],
        "axes": {"env": [{"MY_SECRET_THING": "s3cr3t"}, {"NCCL_DEBUG": "INFO"}]},
        "exclude": [{"env": {"MY_SECRET_THING": "s3cr3t"}}],
    }
    assert secrets.redact(spec) == {
        "settings": {"env": {"DB_URL": "***", "MY_SECRET_THING": "***", "OMP_NUM_THREADS": "1"},
                     "env_visible": ["MY_FLAG"], "command": ["--uri=http://***@h"]},
        "conditions": [{"name": "c", "env": {"MY_FLAG": "1", "OTHER": "***"}}],
        "axes": {"env": [{"MY_SECRET_THING": "***"}, {"NCCL_DEBUG": "INFO"}]},
        "exclude": [{"env": {"MY_SECRET_THING": "***"}}],
    }  # fmt: skip


def test_env_visible_is_validated_and_not_part_of_the_run_key() -> None:
    with pytest.raises(SpecError, match="not an environment variable name") as e:
        expand(parse_spec({"name": "x", "settings": {"env_visible": ["MY FLAG"]}}))
    assert "env_visible" in str(e.value) and "\n" not in str(e.value)
    plain = expand(parse_spec({"name": "x", "settings": {"env": {"A": "1"}}}))[0]
    shown = expand(parse_spec({"name": "x", "settings": {"env": {"A": "1"}, "env_visible": ["A"]}}))[0]
    assert plain.key == shown.key  # showing a value does not change what runs
    assert Settings(env_visible=["APP_*"]).env_visible == ["APP_*"]


def _prepared(tmp_path: Path, settings: dict) -> tuple[RunSpec, RunDir]:
    (run,) = expand(parse_spec({"name": "p", "settings": {"kind": "command", "command": ["prog", "--db", ENV["DB_URL"]], **settings}}))
    return run, launch.prepare(tmp_path / "runs" / "b-1", run, {})


def test_prepare_keeps_real_values_outside_the_run_and_batch_folders(tmp_path: Path, private_root: Path) -> None:
    run, rd = _prepared(tmp_path, {"env": ENV})
    batch_files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert batch_files and all(b"s3cr3t" not in p.read_bytes() and b"pass@" not in p.read_bytes() for p in batch_files)
    assert rd.spec()["settings"]["env"] == {"DB_URL": "***", "MY_SECRET_THING": "***", "OMP_NUM_THREADS": "1"}
    private = rd.private_spec_file
    assert private_root in private.parents and rd.path not in private.parents
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    assert launch.load_runspec(rd).settings.env == ENV  # what the job gets
    env = launch.build_env(launch.load_runspec(rd), rd, base={})
    assert {k: env[k] for k in ENV} == ENV


def test_a_run_whose_private_values_are_gone_is_not_started_with_masks(tmp_path: Path) -> None:
    run, rd = _prepared(tmp_path, {"env": ENV})
    rd.private_spec_file.unlink()
    loaded = launch.load_runspec(rd)
    with pytest.raises(launch.PrivateValuesMissing, match="DB_URL, MY_SECRET_THING") as e:
        launch.start(loaded, rd)
    assert isinstance(e.value, OSError)  # the supervisor's 'could not start: ...'
    assert not rd.exit_file.exists() and not rd.cmd_file.exists()


def test_command_lines_lose_credentials_and_hidden_values(tmp_path: Path) -> None:
    run, rd = _prepared(tmp_path, {"env": ENV, "command": ["prog", "--db", ENV["DB_URL"], "--name=s3cr3t", "1"]})
    argv = launch.build_argv(run, rd)
    shown = ["prog", "--db", "postgres://***@h/db", "--name=***", "1"]
    assert launch.shown_command(run, argv) == shown
    assert rd.spec()["settings"]["command"] == shown  # spec.json's copy of the command too


def test_prune_forgets_only_batches_whose_folder_is_gone(tmp_path: Path, private_root: Path) -> None:
    _, kept = _prepared(tmp_path, {"env": ENV})
    (gone_run,) = expand(parse_spec({"name": "g", "settings": {"env": ENV}}))
    gone = launch.prepare(tmp_path / "other" / "b-2", gone_run, {})
    import shutil

    shutil.rmtree(tmp_path / "other")
    assert secrets.prune_private() == 1
    assert kept.private_spec_file.exists() and not gone.private_spec_file.exists()
    assert len(list(private_root.iterdir())) == 1


def test_slurm_job_script_exports_only_shown_values(tmp_path: Path) -> None:
    s = Settings(env={**ENV, "MY_FLAG": "on", "SHOWN_URL": "http://u:pass@h"}, env_visible=["MY_FLAG", "SHOWN_URL"])
    text = job_script(RunSpec(experiment="x", condition="c", settings=s), RunDir(tmp_path / "c-r0"), SlurmOptions(), port=1)
    assert "export OMP_NUM_THREADS=1" in text and "export MY_FLAG=on" in text
    # hidden ones and a shown one with credentials reach the job through sbatch's environment
    assert "s3cr3t" not in text and "pass@" not in text and "DB_URL" not in text and "SHOWN_URL" not in text


def test_supervisor_output_is_masked_tracebacks_included() -> None:
    """What supervisor.main does first, then a logged and an uncaught exception quoting both secrets."""
    code = (
        "import logging, sys\n"
        "from dstui.core import secrets\n"
        "secrets.remember({'MY_SECRET_THING': 's3cr3t', 'OMP_NUM_THREADS': '1'})\n"
        "secrets.mask_output()\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s', stream=sys.stdout)\n"
        "def fail():\n"
        "    raise RuntimeError('API request to http://user:pass@host:5000/api failed; value s3cr3t')\n"
        "try:\n"
        "    fail()\n"
        "except RuntimeError:\n"
        "    logging.exception('MLflow down at %s', 'http://user:pass@host:5000')\n"
        "print('threads', 1)\n"
        "fail()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    for text in (proc.stdout, proc.stderr):
        assert "pass@" not in text and "s3cr3t" not in text
        assert "RuntimeError: API request to http://***@host:5000/api failed; value ***" in text
    assert "ERROR MLflow down at http://***@host:5000" in proc.stdout and "threads 1" in proc.stdout


def test_failure_reasons_lose_credentials() -> None:
    log = "Traceback (most recent call last):\nConnectionError: cannot reach postgres://u:pass@h/db\n"
    assert classify(log, 1) == "Python: ConnectionError: cannot reach postgres://***@h/db"


def test_old_run_folders_with_their_private_spec_still_launch(tmp_path: Path) -> None:
    """Run folders written before the private files moved out keep working (read, never written)."""
    run, rd = _prepared(tmp_path, {"env": ENV})
    legacy = rd.path / "spec.private.json"
    os.rename(rd.private_spec_file, legacy)
    assert launch.load_runspec(rd).settings.env == ENV
