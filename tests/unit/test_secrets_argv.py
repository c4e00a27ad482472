"""Secrets on command lines (issue 33.5) and a scrubber linear in its input (issue 33.1), as pure functions.

The whole path through a real launch, the store, reports and the terminal is
tests/e2e/test_argv_secrets.py. The property tests check the rewritten URI
scrubber against the old (quadratic) pattern, and that masking never lets a
planted secret through and is stable when applied twice.
"""

from __future__ import annotations

import os
import re
import stat
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dstui.commands.ui import exposure_warning
from dstui.core import credential_text, secrets
from dstui.core.rundir import RunDir
from dstui.execute import launch
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec

# The pattern the URI rule had before issue 33: the behaviour to keep (it was quadratic on letter runs).
OLD_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@")
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
SHAPES = [HF, "sk-proj-" + "a1B2" * 8, "ghp_" + "Z9" * 18, "github_pat_" + "11ABCD_" * 5, "AKIAIOSFODNN7EXAMPLE",
          "xoxb-1234-5678-abcdefghijkl"]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "_KNOWN", set())


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["prog", "--hf_token", "abc123", "--steps", "3"], ["prog", "--hf_token", "***", "--steps", "3"]),
        (["prog", "--api-key=xyz", "--apiKey", "q", "--DB_PASSWORD=p"], ["prog", "--api-key=***", "--apiKey", "***", "--DB_PASSWORD=***"]),
        (["prog", "--auth", "u:p", "--secret", "s", "--wandb-token", "w"], ["prog", "--auth", "***", "--secret", "***", "--wandb-token", "***"]),
        (["prog", "--use-auth", "--steps", "2"], ["prog", "--use-auth", "--steps", "2"]),  # a switch: the next flag stays
        (["prog", "--tokenizer", "gpt2", "--max_tokens", "5", "--author", "me"], ["prog", "--tokenizer", "gpt2", "--max_tokens", "5", "--author", "me"]),
        (["prog", "--hf_token", "{env:HF_TOKEN}", "--key={env:K}"], ["prog", "--hf_token", "{env:HF_TOKEN}", "--key={env:K}"]),
        (["prog", f"--login={HF}", "--uri=http://u:pw@h/x"], ["prog", "--login=***", "--uri=http://***@h/x"]),
    ],
)  # fmt: skip
def test_argv_masks_secret_flags_token_shapes_and_keeps_references(argv: list[str], shown: list[str]) -> None:
    assert secrets.mask_argv(argv) == shown


@pytest.mark.parametrize("token", SHAPES)
def test_token_shapes_are_masked_in_free_text(token: str) -> None:
    assert credential_text.strip_credentials(f"login with {token}, then go") == "login with ***, then go"
    assert credential_text.strip_credentials(f"x{token}") == f"x{token}"  # inside a longer word: not a token


def test_secret_flags_are_masked_in_free_text() -> None:
    text = "python train.py --hf_token abc123 --api-key=xyz --steps 3 'Namespace(--password pw)'"
    assert credential_text.strip_credentials(text) == "python train.py --hf_token *** --api-key=*** --steps 3 'Namespace(--password ***)'"
    logged = "starting ['prog', '--hf_token', 'abc123', \"--secret\", \"s3\", '--steps', '3']"
    assert credential_text.strip_credentials(logged) == "starting ['prog', '--hf_token', '***', \"--secret\", \"***\", '--steps', '3']"


def test_redact_masks_argv_fields_in_every_part_of_a_spec() -> None:
    spec = {
        "settings": {"kind": "command", "command": ["p", "--hf_token", "abc123", "--api-key=xyz"]},
        "conditions": [{"name": "c", "extra_args": ["--secret", "s3"], "launcher": {"extra_args": ["--auth=a"]}}],
    }
    assert secrets.redact(spec) == {
        "settings": {"kind": "command", "command": ["p", "--hf_token", "***", "--api-key=***"]},
        "conditions": [{"name": "c", "extra_args": ["--secret", "***"], "launcher": {"extra_args": ["--auth=***"]}}],
    }  # fmt: skip


def test_env_references_reach_only_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{env:NAME}``: spec.json and cmd.txt name it, the argv the process gets holds the value."""
    monkeypatch.setenv("MY_PAT", "pat-from-the-shell")
    command = ["prog", "--hf_token", "{env:HF_TOKEN}", "--pat={env:MY_PAT}", "--plain", "x"]
    (run,) = expand(parse_spec({"name": "r", "settings": {"kind": "command", "command": command, "env": {"HF_TOKEN": "tok-in-spec-env"}}}))
    rd = launch.prepare(tmp_path / "runs" / "b-1", run, {})
    argv = launch.build_argv(run, rd)
    assert launch.shown_command(run, argv) == command
    env = launch.build_env(launch.load_runspec(rd), rd)
    assert launch.real_argv(argv, env) == ["prog", "--hf_token", "tok-in-spec-env", "--pat=pat-from-the-shell", "--plain", "x"]
    assert "tok-in-spec-env" not in rd.spec_file.read_text() and "{env:HF_TOKEN}" in rd.spec_file.read_text()
    with pytest.raises(launch.EnvRefMissing, match=r"NOPE is not set \(the command names it as \{env:NOPE\}\)"):
        launch.real_argv(["prog", "{env:NOPE}"], env)


def test_prepare_makes_run_and_batch_folders_private_whatever_the_umask(tmp_path: Path) -> None:
    (run,) = expand(parse_spec({"name": "r", "settings": {"kind": "command", "command": ["prog"]}}))
    old = os.umask(0o022)
    try:
        rd = launch.prepare(tmp_path / "runs" / "b-1", run, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(rd.path.stat().st_mode) == 0o700 and stat.S_IMODE(rd.path.parent.stat().st_mode) == 0o700


def test_cli_makes_its_files_private_and_gives_jobs_the_users_umask(tmp_path: Path) -> None:
    """What `dstui` does first (cli.main): umask 077 for itself, the user's for the jobs it starts."""
    code = (
        "import os, sys\n"
        "from dstui.core import secrets\n"
        "os.umask(0o022)\n"
        "secrets.private_umask()\n"
        "open(sys.argv[1], 'w').close()\n"
        "print(oct(secrets.user_umask()))\n"
    )
    made = tmp_path / "made"
    proc = subprocess.run([sys.executable, "-c", code, str(made)], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != secrets.USER_UMASK_ENV})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert oct(made.stat().st_mode & 0o777) == "0o600" and proc.stdout.strip() == "0o22"


# ---- the scrubber: the old behaviour, never a leak, linear ----

URI_ALPHABET = "ab1+.-:/@ \t%é"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=URI_ALPHABET, max_size=60))
def test_uri_rule_matches_the_old_pattern(text: str) -> None:
    old = OLD_URI.sub(lambda m: f"{m.group('scheme')}{credential_text.MASK}@", text)
    assert credential_text.strip_userinfo(text) == old


SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=40)
NOISE = st.text(alphabet=string.ascii_letters + string.digits + " \t-_=:/@.+\n'\"", max_size=80)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=NOISE, after=NOISE, secret=SECRET, form=st.sampled_from(["uri", "flag=", "flag ", "hf", "sk", "ghp", "akia"]))
def test_a_planted_secret_never_survives_and_masking_twice_changes_nothing(before: str, after: str, secret: str, form: str) -> None:
    planted = {
        "uri": f" https://user:{secret}@host/x ",
        "flag=": f" --hf_token={secret} ",
        "flag ": f" --api-key {secret} ",
        "hf": f" hf_{secret}{'x' * 20} ",
        "sk": f" sk-{secret}{'x' * 20} ",
        "ghp": f" ghp_{secret}{'x' * 30} ",
        "akia": " AKIA" + (secret.upper() + "Q" * 16)[:16] + " ",
    }[form]
    text = before + planted + after
    once = credential_text.strip_credentials(text)
    needle = planted.strip().split("=")[-1].split(" ")[-1] if form.startswith("flag") else (secret if form == "uri" else planted.strip())
    assume(needle not in before + after)  # the noise may hold the same letters by chance
    assert needle not in once
    assert credential_text.strip_credentials(once) == once


def test_ui_warns_when_it_would_listen_beyond_this_host() -> None:
    assert exposure_warning("127.0.0.1", 5000) is None and exposure_warning("localhost", 5000) is None
    text = exposure_warning("0.0.0.0", 5001)
    assert text and "without authentication" in text and "ssh -L 5001:127.0.0.1:5001" in text and "basic-auth" in text


def test_a_slurm_rank_resolves_references_from_the_jobs_environment(tmp_path: Path) -> None:
    """job.sh holds ``{env:NAME}``; each rank (dstui.execute.injob.slurm_rank) puts the value in its own argv."""
    show = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "--hf_token", "{env:MY_TOKEN}"]
    env = {**os.environ, "MY_TOKEN": "tok-from-sbatch-env"}
    ok = subprocess.run([sys.executable, "-m", "dstui.execute.injob.slurm_rank", "--", *show], capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "['--hf_token', 'tok-from-sbatch-env']", ok.stderr
    env.pop("MY_TOKEN")
    gone = subprocess.run([sys.executable, "-m", "dstui.execute.injob.slurm_rank", "--", *show], capture_output=True, text=True, env=env, timeout=60)
    assert gone.returncode == 127 and "MY_TOKEN is not set (the command names it as {env:MY_TOKEN})" in gone.stderr


def test_a_slurm_job_script_names_argv_secrets_and_sbatch_gets_them(tmp_path: Path) -> None:
    from dstui.execute.backends.slurm_script import hidden_argv, job_script
    from dstui.spec.experiment import SlurmOptions

    command = ["prog", "--hf_token", "abc123", f"--login={HF}", "--ref", "{env:MY_TOKEN}", "--steps", "3"]
    (run,) = expand(parse_spec({"name": "s", "settings": {"kind": "command", "command": command}}))
    rd = RunDir(tmp_path / "s-r0")
    text = job_script(run, rd, SlurmOptions(), port=1234)
    assert "abc123" not in text and HF not in text
    assert "--hf_token '{env:DSTUI_ARGV_2}' '{env:DSTUI_ARGV_3}' --ref '{env:MY_TOKEN}' --steps 3" in text
    argv, values = hidden_argv(run, launch.build_argv(run, rd, port=1234))
    assert values == {"DSTUI_ARGV_2": "abc123", "DSTUI_ARGV_3": f"--login={HF}"}
    assert secrets.resolve_env_refs(argv, {**values, "MY_TOKEN": "t"}) == [*command[:5], "t", "--steps", "3"]
