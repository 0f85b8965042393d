"""A server's KV pool as it says it: its /metrics read (over HTTP, or a saved copy) into
the `bstar.kvcheck.ServerPool` that `check_kv` compares with bstar's pool (`bstar kv`)."""

from __future__ import annotations

from bstar.errors import BstarError
from bstar.kvcheck import ServerPool
from bstar.loadgen.scrape import METRICS_MAX_BYTES, Snapshot, read_snapshot


def fetch_metrics(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> str:
    """The server's Prometheus text (`GET {url}/metrics`): at most `METRICS_MAX_BYTES`,
    within `timeout_s` whatever the server does, the key sent to its origin only
    (bstar.safehttp). A `url` that is not http(s)://host[:port] is refused first."""
    import urllib.parse

    from bstar.safehttp import FetchError, fetch

    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError as e:  # 'http://[::1', a port out of range
        raise BstarError(f"--url {url!r} is not a URL ({e})") from None
    if not host or parts.scheme not in ("http", "https"):
        raise BstarError(f"--url {url!r} is not a URL (http://host:port)")

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        got = fetch(url.rstrip("/") + "/metrics", headers=headers,
                    max_bytes=METRICS_MAX_BYTES, timeout_s=timeout_s)
    except FetchError as e:
        raise BstarError(f"could not read {url.rstrip('/')}/metrics: {e}") from None
    if got.status != 200:
        raise BstarError(f"could not read {url.rstrip('/')}/metrics: HTTP {got.status}")
    return got.body.decode("utf-8", "replace")


def server_pool(snap: Snapshot) -> ServerPool:
    """The KV pool figures of one scrape."""
    return ServerPool(snap.engine, snap.num_gpu_blocks, snap.block_size,
                      snap.kv_cache_memory_bytes, snap.kv_cache_size_tokens)


def server_pool_text(metrics_text: str) -> ServerPool:
    """The KV pool figures of one /metrics text."""
    return server_pool(read_snapshot(metrics_text))
