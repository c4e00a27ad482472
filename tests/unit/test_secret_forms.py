"""Issue 40.7's secret forms, as pure functions: each leaked into 20 files, the 11 documented forms into none.

``Authorization: Bearer V``, ``-p V``, ``{"token": "V"}`` and ``HF_TOKEN=V`` are masked in
command lines (argv elements) and in free text (logs, reasons, cmd.txt); their look-alikes
that hold no secret (``ssh -p 22``, ``mkdir -p /x``, ``TOKENIZERS_PARALLELISM=false``, a
metrics record's ``tokens_per_s``, a header's ``tokenizers`` version) stay as they are. The
property test plants a random secret in every form among random noise: it never survives,
and masking twice changes nothing. The whole path (a real run, every file, the terminal):
tests/e2e/test_argv_secret_forms.py.
"""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dstui.core import secrets
from dstui.core.credential_text import strip_credentials
from dstui.core.secrets import mask_argv


@pytest.fixture(autouse=True)
def _no_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "_KNOWN", set())


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["curl", "-H", "Authorization: Bearer tok123456"], ["curl", "-H", "Authorization: Bearer ***"]),
        (["curl", "-H", "authorization:Basic dXNlcjpwYXNz"], ["curl", "-H", "authorization:Basic ***"]),
        (["sshpass", "-p", "pw-123", "ssh", "-p", "2222", "h"], ["sshpass", "-p", "***", "ssh", "-p", "2222", "h"]),
        (["mkdir", "-p", "/tmp/out"], ["mkdir", "-p", "/tmp/out"]),
        (["prog", "--config", '{"token": "v4lue", "steps": 3}'], ["prog", "--config", '{"token": "***", "steps": 3}']),
        (["env", "HF_TOKEN=hfvalue", "PGPASSWORD=pg", "OMP_NUM_THREADS=1", "prog"],
         ["env", "HF_TOKEN=***", "PGPASSWORD=***", "OMP_NUM_THREADS=1", "prog"]),
        (["bash", "-c", "HF_TOKEN=abc python train.py -p s3cr3t"], ["bash", "-c", "HF_TOKEN=*** python train.py -p ***"]),
        (["prog", "-p", "{env:DB_PW}", "HF_TOKEN={env:HF_TOKEN}"], ["prog", "-p", "{env:DB_PW}", "HF_TOKEN={env:HF_TOKEN}"]),
    ],
)  # fmt: skip
def test_the_four_forms_are_masked_in_argv(argv: list[str], shown: list[str]) -> None:
    assert mask_argv(argv) == shown


@pytest.mark.parametrize(
    "text",
    [
        "TOKENIZERS_PARALLELISM=false MASTER_PORT=29500 CUDA_VISIBLE_DEVICES=0,1",
        json.dumps({"type": "step", "step": 3, "loss": 1.5, "tokens_per_s": 123.4}),
        json.dumps({"type": "header", "versions": {"tokenizers": "0.15.2", "torch": "2.13.0"}, "key": 3}),
        "ssh -p 22 host; mkdir -p ./out ~/x ../y; the bearer of bad news",
        "Epoch 1, Step 10, Loss: 2.5 sync: True time: 0.1 alloc_mem: 1 peak_mem: 2",
        json.dumps({"run": "z0-mb1-r0", "key": "1effc17928da4a4d", "state": "planned"}),  # dstui's own --json
        "sort key=name",
        "env PWD=/work/run DSTUI_RUN_KEY=1effc17928da4a4d AWS_REGION=eu python x.py",
        "model: flops_per_token=1.2e9 params=1.1e9 {'flops_per_token': '7.5e8'}",
    ],
)
def test_look_alikes_that_hold_no_secret_stay(text: str) -> None:
    assert strip_credentials(text) == text


def test_the_forms_in_free_text() -> None:
    assert strip_credentials("GET / HTTP/1.1\r\nProxy-Authorization: Basic dXNlcg==\r\n") == "GET / HTTP/1.1\r\nProxy-Authorization: Basic ***\r\n"
    assert strip_credentials("sent Bearer eyJhbGciOiJIUzI1NiJ9.e30.x") == "sent Bearer ***"
    assert strip_credentials("Namespace(password='pw', token=\"tk\", steps=3)") == "Namespace(password='***', token=\"***\", steps=3)"
    assert strip_credentials("{'api_key': 'k1', 'model': 'gpt2'}") == "{'api_key': '***', 'model': 'gpt2'}"
    assert strip_credentials("https://h/x?token=abcd&page=2") == "https://h/x?token=***&page=2"
    assert strip_credentials("['mysql', '-p', 'pw', '-P', '3306']") == "['mysql', '-p', '***', '-P', '3306']"


# digits alone are a port after -p, and 12e34 reads as a measurement: those stay, by design
SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=40).filter(
    lambda s: not s.isdigit() and not re.fullmatch(r"\d+[eE]\d+", s))
NOISE = st.text(alphabet=string.ascii_letters + string.digits + " \t-_=:/@.+\n'\"{},", max_size=80)
FORMS = {
    "header": "Authorization: Bearer {}",
    "basic": "authorization=Basic {}",
    "bearer": "Bearer {}",
    "-p": "-p {}",
    "-p list": "'-p', '{}'",
    "json": '{{"token": "{}"}}',
    "dict": "{{'db_password': '{}'}}",
    "env": "HF_TOKEN={}",
    "quoted env": 'API_KEY="{}"',
}


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=NOISE, after=NOISE, secret=SECRET, form=st.sampled_from(sorted(FORMS)))
def test_a_planted_secret_in_any_new_form_never_survives(before: str, after: str, secret: str, form: str) -> None:
    planted = FORMS[form].format(secret)
    text = f"{before} {planted} {after}"
    assume(secret not in before + after)  # the noise may hold the same letters by chance
    assume(secret.lower() not in FORMS[form].lower())  # ... and so may the form's own words
    once = strip_credentials(text)
    assert secret not in once, (text, once)
    assert strip_credentials(once) == once
    argv = ["prog", "-p", secret] if form.startswith("-p") else ["prog", text]  # one element holds it
    assert not any(secret in a for a in mask_argv(argv)), mask_argv(argv)
