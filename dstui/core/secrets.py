"""Credentials never leave the process that needs them: not in files, artifacts, logs or params.

Two rules: a URI's ``user:password@`` part is replaced by ``***@`` wherever it
appears in text (tracking URIs, env values such as DB_URL, error messages), and
the value of an environment variable whose name looks secret is masked whole.
"""

from __future__ import annotations

import re

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
MASK = "***"
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def strip_credentials(text: str) -> str:
    """``postgres://u:pass@h/db`` -> ``postgres://***@h/db``, anywhere in ``text``."""
    return _URI_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def redact(obj: object) -> object:
    """A copy safe to write anywhere: secret-named ``env`` values masked, URI credentials stripped."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "env" and isinstance(v, dict):
                out[k] = {n: (MASK if is_secret(str(n)) else redact(x)) for n, x in v.items()}
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list):
        return [redact(x) for x in obj]
    if isinstance(obj, str):
        return strip_credentials(obj)
    return obj
