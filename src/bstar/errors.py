"""Errors a user can cause. The CLI prints them on one line and exits 2."""

from __future__ import annotations

from collections.abc import Iterable


class BstarError(ValueError):
    """A user error: bad input, unknown name, impossible setting. Never a bug."""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """'; did you mean: a, b?' or '' -- for one-line unknown-name messages."""
    import difflib  # only for a name not found: every command imports this module

    pool = sorted(set(candidates))
    matches = difflib.get_close_matches(name.lower(), pool, n=n, cutoff=0.4)
    if not matches:
        matches = [c for c in pool if name.lower() in c][:n]
    return f"; did you mean: {', '.join(matches)}?" if matches else ""


# Optional parts of bstar: the module that is missing -> the extra that installs it. The
# base install (numpy, rich, scipy, aiohttp) runs plan, fit, calibrate, sweep and simulate.
EXTRA_OF_MODULE: dict[str, str] = {
    "matplotlib": "plot", "jinja2": "plot", "markupsafe": "plot",
    "safetensors": "tiny", "tokenizers": "tiny", "gguf": "tiny",
    "xllamacpp": "llamacpp",
}
BASE_MODULES: dict[str, str] = {"numpy": "numpy", "rich": "rich", "scipy": "scipy",
                                "aiohttp": "aiohttp"}


def missing_module_message(name: str | None, command: str = "this command") -> str | None:
    """One line for a missing optional module: which extra and the pip command; for a base
    dependency, how to repair the install. None when `name` is not bstar's to name."""
    top = (name or "").split(".")[0]
    if top in EXTRA_OF_MODULE:
        extra = EXTRA_OF_MODULE[top]
        return (f"{command} needs {top}, from the '{extra}' extra: "
                f"pip install 'bstar[{extra}]'")
    if top in BASE_MODULES:
        return (f"{command} needs {top}, a base dependency of bstar that is not installed: "
                f"pip install bstar (or pip install {BASE_MODULES[top]})")
    return None
