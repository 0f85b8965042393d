"""One redaction for every text bstar stores or prints: API keys and URL credentials.

A secret can come back from anywhere -- a server's error body that echoes the request's
`Authorization` header (proxies do), an exception message holding the URL, a status line --
so the store, `--json` and error lines all pass their text through `redact` (or
`redact_obj` for a JSON-able value) instead of trusting each source. Two nets:

- the values registered with `register_secret` (the `--api-key` / `$OPENAI_API_KEY` in use;
  `$OPENAI_API_KEY`, `$HF_TOKEN` and `$HUGGING_FACE_HUB_TOKEN` are always included), a
  URL's password (`register_url`) and the keys a `--server-cmd` passes its server
  (`register_command`), replaced wherever they appear;
- patterns: `user:password@` in a URL, `Bearer <token>` / `Basic <token>`, `sk-...` style
  keys, `api_key=...`-style pairs and credential-like URL query parameters (`?token=`,
  `?key=`; `register_url` registers their values too).

Pure text in, text out; no I/O beyond reading the environment variable.
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any

MASK = "***"

_registered: set[str] = set()

# scheme://user:password@host -> scheme://user:***@host ; scheme://token@host -> ***@host
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@?#\"]+)@")
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>[Bb]earer|BEARER)(?P<sep>\s+|%20|\+)"
                          r"(?P<token>[^\s\"',;}\]\\]+)"
                          r"|\b(?P<scheme2>Basic)(?P<sep2>\s+)(?P<token2>[A-Za-z0-9+/]{8,}=*)")
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk|hf|ghp|gho|xox[abp])[-_][A-Za-z0-9_\-]{6,}")
_PAIR = re.compile(r"(?i)(?P<key>[\"']?(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token"
                   r"|password|passwd|secret|x-api-key)[\"']?\s*[:=]\s*[\"']?)"
                   r"(?P<val>[^\s\"'&,;}\]]+)")
# A URL query parameter whose name's last word says it holds a credential: `?token=`,
# `?key=`, `&api_key=`, `?X-Amz-Signature=`, `?client_secret=`, `?sig=` (`?max_tokens=`
# is no credential: its last word is "tokens").
_QUERY_KEY_WORDS = ("token", "key", "apikey", "secret", "password", "passwd", "pwd", "pass",
                    "auth", "sig", "signature", "credential", "credentials", "jwt", "session")
_QUERY_KEY = re.compile(r"(?i)(?P<key>[?&;](?:[\w.~%-]*[_.~-])?(?:"
                        + "|".join(_QUERY_KEY_WORDS) + r")=)(?P<val>[^&#\s\"'<>]+)")
# "/etc/passwd: No such file or directory" names a file, not a password: a pair whose value
# reads as an OS error message (strerror, for every errno this system knows) is left alone.
_OS_ERRORS = tuple({os.strerror(n) for n in errno.errorcode})


# Cheap tests first (substring search): a pattern runs only on text that holds what it
# needs (a fit's --json is megabytes of numbers and keys like "tpot_ms").
_KEY_PREFIXES = ("sk-", "sk_", "pk-", "pk_", "rk-", "rk_", "hf-", "hf_", "ghp", "gho", "xox")
_PAIR_WORDS = ("api", "pass", "secret", "access", "auth")


def register_secret(value: str | None) -> None:
    """Remember a secret in use (an API key) so that `redact` removes it wherever it shows
    up, even where no pattern would spot it. Values shorter than 4 characters are ignored
    (masking every 'a' would garble the text and hide nothing)."""
    if value and len(value) >= 4:
        _registered.add(value)


def register_url(url: str | None) -> None:
    """Register a URL's credentials (`http://user:PW@host`): the password (or a token given
    as the user), and both as the Basic auth header carries them, base64-encoded; and the
    value of each credential-like query parameter (`?token=K`, `?key=K`, `&api_key=K`)."""
    if not isinstance(url, str):
        return
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url.strip())
        user, password = parts.username, parts.password
    except ValueError:
        return
    # A credential in the query (`?token=K`, `&api_key=K`): its value is a secret like a
    # password, masked wherever it appears (stored, printed, echoed by a server).
    for m in _QUERY_KEY.finditer(f"?{parts.query}" if parts.query else ""):
        register_secret(m.group("val"))
        register_secret(unquote(m.group("val")))
    if user is None:
        return
    secret = password if password is not None else user
    register_secret(secret)
    register_secret(unquote(secret))
    import base64

    pair = f"{unquote(user)}:{unquote(password or '')}"
    register_secret(base64.b64encode(pair.encode()).decode())


# Flags and variables whose value is a secret in a server's command line (vLLM's
# --api-key, SGLang's --api-key, TGI's --api-key, tokens for the Hub).
_SECRET_FLAG = re.compile(r"(?i)^--?(?:api[-_]?key|token|hf[-_]token|password|secret"
                          r"|auth[-_]token|access[-_]token)$")
_SECRET_VAR = re.compile(r"(?i)^[A-Z0-9_]*(?:API_KEY|TOKEN|PASSWORD|SECRET)$")


def register_command(cmd: str | None) -> None:
    """Register the secrets a command line passes (`--api-key K`, `--api-key=K`,
    `OPENAI_API_KEY=K ...`): `--server-cmd` is echoed, stored and logged."""
    if not isinstance(cmd, str) or not cmd:
        return
    import shlex

    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if _SECRET_FLAG.match(name):
            if eq:
                register_secret(value)
            elif i + 1 < len(words):
                register_secret(words[i + 1])
        elif eq and _SECRET_VAR.match(name):
            register_secret(value)
        elif "://" in w:
            register_url(w)


_ENV_SECRETS = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _secrets() -> list[str]:
    """The registered secrets and the environment's keys, each also as it reads inside a
    JSON string (escaped), longest first."""
    out = set(_registered)
    for var in _ENV_SECRETS:
        env = os.environ.get(var)
        if env and len(env) >= 4:
            out.add(env)
    out |= {json.dumps(s)[1:-1] for s in out}
    return sorted(out, key=len, reverse=True)


def _userinfo(m: re.Match[str]) -> str:
    info = m.group("userinfo")
    user, sep, _ = info.partition(":")
    return f"{m.group('scheme')}{user}:{MASK}@" if sep else f"{m.group('scheme')}{MASK}@"


def _auth(m: re.Match[str]) -> str:
    if m.group("scheme"):
        return f"{m.group('scheme')}{m.group('sep')}{MASK}"
    return f"{m.group('scheme2')}{m.group('sep2')}{MASK}"


def redact(text: str, *, patterns: bool = True, secrets: list[str] | None = None) -> str:
    """`text` with every known secret and credential-looking token replaced by ***;
    `patterns=False` masks only the registered secrets (text that is the user's own data,
    such as a prompt, keeps its look-alikes)."""
    if not text:
        return text
    for s in _secrets() if secrets is None else secrets:
        if s in text:
            text = text.replace(s, MASK)
    if not patterns:
        return text
    if "@" in text and "://" in text:
        text = _URL_USERINFO.sub(_userinfo, text)
    if "earer" in text or "EARER" in text or "Basic" in text:
        text = _AUTH_SCHEME.sub(_auth, text)
    if any(k in text for k in _KEY_PREFIXES):
        text = _KEY_LIKE.sub(MASK, text)
    if "=" in text and ("?" in text or "&" in text or ";" in text):
        text = _QUERY_KEY.sub(lambda m: f"{m.group('key')}{MASK}", text)
    lower = text.lower()
    if any(w in lower for w in _PAIR_WORDS):
        text = _PAIR.sub(_pair, text)
    return text


def _pair(m: re.Match[str]) -> str:
    key = m.group("key")
    # A quoted value (`"password": "..."`) is a value, whatever it reads like.
    # The longest OS error message is under 60 characters: 200 of the rest are enough.
    rest = m.string[m.start("val"):m.start("val") + 200]
    if not key.endswith(("'", '"')) and _is_os_error(rest):
        return m.group(0)  # "passwd: No such file or directory": a file's name, an OS error
    return f"{key}{MASK}"


def _is_os_error(rest: str) -> bool:
    """Whether `rest` (what follows `passwd:`) reads as an OS error message: one whole
    ("Permission denied"), or cut after at least three words ("No such file")."""
    phrase = " ".join(re.split(r"[\n\"'(\[{;,]", rest, maxsplit=1)[0].split())
    if any(phrase.startswith(e) for e in _OS_ERRORS):
        return True
    return len(phrase.split()) >= 3 and any(e.startswith(phrase) for e in _OS_ERRORS)


def clip(text: str, n: int) -> str:
    """`text` masked, then cut to `n` characters: in that order, since a key cut in two is
    no longer one `redact` recognises (an error body cut at 300 characters kept 17 of a
    40-character key)."""
    text = redact(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def redact_opt(text: str | None) -> str | None:
    return None if text is None else redact(text)


def redact_url(url: str) -> str:
    """A URL fit to store or print: credentials (`user:key@`) and key-like query values
    masked."""
    return redact(url)


def redact_obj(obj: Any, secrets: list[str] | None = None) -> Any:
    """A JSON-able value with every string in it (keys too) redacted."""
    sec = _secrets() if secrets is None else secrets
    if isinstance(obj, str):
        return redact(obj, secrets=sec)
    if isinstance(obj, dict):
        return {redact(k, secrets=sec) if isinstance(k, str) else k: redact_obj(v, sec)
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v, sec) for v in obj]
    return obj


def redact_json(text: str) -> str:
    """A JSON document's text with the secrets in its strings masked. Safe on JSON: no
    pattern crosses a quote, and *** needs no escaping (one pass over the text instead of
    one per string: a fit's --json of 200k points has millions)."""
    return redact(text)
