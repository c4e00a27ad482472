"""Credentials are stripped from URIs and env values masked unless shown (issue 20), as pure functions."""

from __future__ import annotations

from dstui.core.credential_text import strip_credentials
from dstui.core.secrets import redact
from dstui.execute import store


def test_uri_credentials_are_stripped_anywhere_in_text() -> None:
    assert strip_credentials("http://user:pass@host:5000/x") == "http://***@host:5000/x"
    assert strip_credentials("error talking to postgres://u:p@h/db: refused") == "error talking to postgres://***@h/db: refused"
    assert strip_credentials("https://token@github.com/a/b.git") == "https://***@github.com/a/b.git"
    assert strip_credentials("sqlite:////tmp/m.db and mail a@b.c") == "sqlite:////tmp/m.db and mail a@b.c"


def test_redact_masks_secret_names_and_strips_uris_everywhere() -> None:
    # shown names (env_visible) keep their values, less URI credentials; the rest is masked whole
    spec = {"settings": {"env": {"HF_TOKEN": "hf_x", "DB_URL": "postgres://u:p@h/db", "N": "1"}, "env_visible": ["DB_URL", "N"], "command": ["--uri=http://a:b@h"]}}
    assert redact(spec) == {"settings": {"env": {"HF_TOKEN": "***", "DB_URL": "postgres://***@h/db", "N": "1"}, "env_visible": ["DB_URL", "N"], "command": ["--uri=http://***@h"]}}


def test_supervisor_takes_the_full_uri_from_its_environment(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:pw@host:5000")
    assert store.resolve_uri("http://***@host:5000") == "http://user:pw@host:5000"
    assert store.resolve_uri("http://other:5000") == "http://other:5000"  # a different server: as recorded
