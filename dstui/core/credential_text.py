"""Credentials out of free text (logs, command lines, reasons, artifacts), in time linear in its length.

The rules (issue 33.5; the forms of issue 40.7 added), each anchored on a rare
character or word so that a try costs a bounded look around it
(benchmarks/scrubber.py: a 10 MiB line in well under a second):

* a URI's ``user:password@`` -> ``***@`` (anchored on ``://``);
* the value of a flag whose name says secret: ``--hf_token V``, ``--api-key=V``,
  a Python list's ``'--secret', 'V'``, and ``-p V`` (mysql's, sshpass's and
  docker login's password; digits alone are a port and a path is ``mkdir -p``'s: they stay);
* an HTTP ``Authorization:`` header's credentials (``Bearer``/``Basic``/... kept)
  and a ``Bearer`` token wherever it stands;
* a quoted key that says secret, in JSON or a Python dict: ``{"token": "V"}``;
* ``NAME=V`` where NAME says secret (``HF_TOKEN=V``, ``PGPASSWORD=V``,
  ``api_key='V'``, ``?token=V&``): an environment assignment on a command line;
* the well-known token shapes (``hf_…``, ``sk-…``, ``ghp_…``, ``github_pat_…``,
  ``AKIA…``, ``xox?-…``).

A name "says secret" when one of its words (split at ``_ - .`` and case changes)
is token, key, secret, password, auth, ... (:func:`is_secret_name`): ``hf_token``
and ``apiKey`` do, ``tokenizers`` and ``tokens_per_s`` do not. A quoted key or an
assignment takes a stricter reading (``key`` only as api/secret/access/private
key, never ``pwd``), and a measurement (``0.5``, ``1.2e9``) is not a secret there:
a run's ``"key"``, ``PWD=/x`` and ``flops_per_token=1.2e9`` stay. An ``{env:NAME}``
reference is left as it is: it names a value, it does not hold one.
"""

from __future__ import annotations

import functools
import re

MASK = "***"

# '://' then a URI's userinfo: up to the first '/', '@' or whitespace, when that is an '@'.
_USERINFO = re.compile(r"://(?=[^/@\s:])[^/@\s]*@")
_SCHEME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")
SCHEME_LOOKBACK = 64  # a scheme longer than this still counts: its last 64 characters are looked at
# Well-known token shapes, each behind a literal prefix (linear: a failed try costs at most the
# prefix plus the minimum length). Not preceded by a word character: 'xhf_...' is not a token.
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_])(?:"
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic (sk-proj-..., sk-ant-...)
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub classic tokens
    r"|github_pat_[A-Za-z0-9_]{22,}"  # GitHub fine-grained tokens
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"  # AWS access key ids
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r")"
)
# Words of a flag name that say its value is secret (--hf_token, --api-key, --apiKey, --db-password).
ARGV_SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "pwd", "auth", "authorization",
                     "credential", "credentials", "apikey")  # fmt: skip
_FLAG_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
# '--name=value', '--name value' or a Python list's "'--name', 'value'" in free text; the name
# is bounded, so a run of dashes or letters costs one try per '-'.
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]{0,63})(=|[ \t]{1,8}|['\"], ?['\"])(?!-)([^\s'\",;)\]}]+)")

SHORT_PASSWORD_FLAG = "-p"  # mysql, sshpass, docker login, ...: masked unless a port (ssh -p 22) or a path (mkdir -p /x)
_PORT_OR_PATH = re.compile(r"\d{1,5}|(?:/|\./|\.\./|~).*", re.DOTALL)
# 'Authorization: Bearer V' / 'Proxy-Authorization=Basic V': the scheme word stays, its credentials go.
_AUTH_HEADER = re.compile(
    r"(?i)(?<![\w-])((?:proxy-)?authorization[ \t]*[:=][ \t]*)((?:bearer|basic|token|digest|negotiate|bot)[ \t]+)?(?!\{env:)([^\s'\",;]+)"
)
_BEARER = re.compile(r"(?i)(?<![\w-])(bearer[ \t]+)(?!\*\*\*)([A-Za-z0-9._~+/=-]{8,})")
# '"key": "V"' / "'key': 'V'": a quoted name, a colon, a quoted value (JSON, a Python dict, YAML flow).
_QUOTED_KEY = re.compile(r"([\"'])([A-Za-z_][\w.-]{0,63})\1([ \t]*:[ \t]*)(?:\"([^\"\\\n]*)\"|'([^'\\\n]*)')")
# 'NAME=V', 'NAME="V"': not after a word character, '-' or '.', so a flag's own '--name=V' is the flag rule's.
_ASSIGNMENT = re.compile(r"(?<![\w.-])([A-Za-z_][A-Za-z0-9_.-]{0,63})=([\"']?)(?!\{env:)([^\s'\";,&)\]}]+)")


_AUTH_WORD = re.compile("authorization", re.IGNORECASE)
_BEARER_WORD = re.compile("bearer", re.IGNORECASE)


def strip_credentials(text: str) -> str:
    """Credentials out of free text, in time linear in its length (the rules: this module's docstring)."""
    if not text:
        return text
    text = strip_userinfo(text)
    if "-" in text:
        text = _FLAG_IN_TEXT.sub(_mask_flag_match, text)
    # the case-blind rules run only where their word is (a scan of each costs more); never text.lower():
    # on text with one non-Latin-1 character it allocates 14 bytes a character (14 MiB for a 1 MiB log)
    if _AUTH_WORD.search(text):
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{MASK}", text)
    if ":" in text:
        text = _QUOTED_KEY.sub(_mask_quoted_key, text)
    if "=" in text:
        text = _ASSIGNMENT.sub(_mask_assignment, text)
    if _BEARER_WORD.search(text):
        text = _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _TOKEN_SHAPES.sub(MASK, text)


def strip_userinfo(text: str) -> str:
    """``scheme://user:pass@`` -> ``scheme://***@``: anchored on '://' (rare), the scheme looked back for.

    The userinfo is what lies between '://' and the first '/', '@' or whitespace
    when that is an '@' and the userinfo does not start with ':'. A try stops at
    the next '/', so the tries of two '://' never overlap: linear overall.
    """
    if "://" not in text:
        return text
    out: list[str] = []
    done = 0  # text[:done] is in out
    for m in _USERINFO.finditer(text):
        if _has_scheme(text, m.start()):
            out += [text[done : m.start() + 3], MASK]
            done = m.end() - 1  # the '@' stays
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _has_scheme(text: str, at: int) -> bool:
    """Whether '://' at ``at`` follows a scheme: scheme characters with a letter among them."""
    i = at
    while i > 0 and text[i - 1] in _SCHEME_CHARS:
        if at - i >= SCHEME_LOOKBACK:
            return True  # a longer run: masking too much is safe, scanning it all is not
        i -= 1
        if text[i].isascii() and text[i].isalpha():
            return True
    return False


@functools.lru_cache(maxsize=4096)  # a log repeats the same few names
def is_secret_name(name: str) -> bool:
    """Whether a name says its value is secret: ``hf_token``, ``apiKey``, ``DB_PASSWORD``, ``PGPASSWORD``; not ``tokenizers``."""
    words = [w.lower() for w in _FLAG_WORD.findall(name[:128])]
    joined = "".join(words)
    return any(w in ARGV_SECRET_WORDS for w in words) or joined.endswith(("token", "apikey", "secret", "password", "passwd"))


def is_secret_flag(flag: str) -> bool:
    """Whether a command-line flag's name says its value is secret (``--hf_token``, ``--apiKey``, ``-p``)."""
    name = flag.lstrip("-")
    if not name or not flag.startswith("-"):
        return False
    return flag == SHORT_PASSWORD_FLAG or is_secret_name(name)


def keeps_value(flag: str, value: str) -> bool:
    """A secret flag's value that stays: a reference (``{env:NAME}``), a mask already, a port or path after ``-p``."""
    return value == MASK or value.startswith("{env:") or (flag == SHORT_PASSWORD_FLAG and _PORT_OR_PATH.fullmatch(value) is not None)


def _mask_flag_match(m: re.Match[str]) -> str:
    if not is_secret_flag(m.group(1)) or keeps_value(m.group(1), m.group(3)):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{MASK}"


# The broad rules (a quoted key, an assignment) meet every dict and env line of a log, so they take a
# stricter reading than a flag's: "key" counts only as the end of api/secret/access/private key, and
# "pwd" not at all (PWD is the working directory). A run's "key" in dstui's own JSON, DSTUI_RUN_KEY,
# a dict's "key" and PWD=/x stay; --key V and --pwd V are still masked by the flag rule.
STRICT_WORDS = ("token", "secret", "password", "passwd", "credential", "credentials", "auth", "authorization", "apikey")
STRICT_ENDINGS = ("token", "secret", "password", "passwd", "apikey", "secretkey", "accesskey", "privatekey")


_MEASURE = re.compile(r"[-+]?\d*\.\d+(?:[eE][-+]?\d+)?|[-+]?\d+(?:\.\d*)?[eE][-+]?\d+")  # 0.5, 1.2e9: a measurement


@functools.lru_cache(maxsize=4096)
def _names_a_secret(name: str) -> bool:
    words = [w.lower() for w in _FLAG_WORD.findall(name[:128])]
    return any(w in STRICT_WORDS for w in words) or "".join(words).endswith(STRICT_ENDINGS)


def _mask_quoted_key(m: re.Match[str]) -> str:
    value = m.group(4) if m.group(4) is not None else m.group(5)
    if not value or value == MASK or value.startswith("{env:") or _MEASURE.fullmatch(value) or not _names_a_secret(m.group(2)):
        return m.group(0)
    quote = '"' if m.group(4) is not None else "'"
    return f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{quote}{MASK}{quote}"


def _mask_assignment(m: re.Match[str]) -> str:
    if m.group(3) == MASK or _MEASURE.fullmatch(m.group(3)) or not _names_a_secret(m.group(1)) or m.group(1).lower().endswith("authorization"):
        return m.group(0)
    return f"{m.group(1)}={m.group(2)}{MASK}"  # a closing quote stays where it was (an authorization: the header rule's)
