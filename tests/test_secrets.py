"""Issue 19, defect 1: an API key or URL credentials never reach the results DB, an export,
`--json` or an error line, wherever the text came from. The hostile server here answers
every completion with a 500 whose body repeats the request's headers (proxies do)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bstar.cli import main
from bstar.redact import redact, redact_obj, redact_url, register_secret

KEY = "sk-hostile-SECRET-0123456789"
URL_PASSWORD = "pw-URLSECRET-987"


class _Echo(BaseHTTPRequestHandler):
    """/v1/models answers; everything else is a 500 that echoes the headers back."""

    def log_message(self, *a: object) -> None:  # quiet
        return

    def _send(self, status: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self._send(500, {"error": {"message": f"upstream failed; request headers: "
                                                  f"{dict(self.headers)}"}})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if self.path.startswith("/tokenize"):
            self._send(404, {"error": "no tokenize"})
            return
        self._send(500, {"error": {"message": "proxy error", "echo": {
            "Authorization": self.headers.get("Authorization"),
            "raw": f"Authorization: {self.headers.get('Authorization')}"}}})


@pytest.fixture()
def echo_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_redact_patterns() -> None:
    register_secret("plainkeyvalue42")
    assert redact("echo plainkeyvalue42 back") == "echo *** back"
    assert KEY not in redact(f'{{"Authorization": "Bearer {KEY}"}}')
    assert redact("Authorization: Bearer abc.def-ghi") == "Authorization: Bearer ***"
    assert redact_url("http://bob:hunter2@10.0.0.1:8000/v1") == "http://bob:***@10.0.0.1:8000/v1"
    assert redact("see https://tok3n@h.example/x") == "see https://***@h.example/x"
    assert redact("GET /v1?api_key=zzz123&x=1") == "GET /v1?api_key=***&x=1"
    # Ordinary text is left alone.
    plain = "max_tokens=16; token count 5; basic usage; task-abcdefgh"
    assert redact(plain) == plain
    assert redact_obj({"u": ["http://a:b@h"], "n": 1.5}) == {"u": ["http://a:***@h"], "n": 1.5}
    # Idempotent: masking twice changes nothing.
    once = redact(f"http://u:p@h Bearer {KEY}")
    assert redact(once) == once


def test_echoed_key_and_url_credentials_never_stored_or_printed(
        echo_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    db = tmp_path / "store" / "r.db"
    common = ["--served-model", "tiny", "--concurrency", "2", "--input-len", "8",
              "--output-len", "4", "--num-requests", "10", "--warmup-requests", "0",
              "--request-timeout", "10", "--level-time-limit", "30", "--db", str(db),
              "--json", "--quiet"]
    # URL credentials (aiohttp sends them as Basic auth, which the server echoes too).
    url = echo_server.replace("http://", f"http://alice:{URL_PASSWORD}@")
    rc = main(["sweep", "--url", url, *common])
    out_url = capsys.readouterr()
    assert rc in (0, 1), out_url.err
    assert json.loads(out_url.out)["url"].startswith("http://alice:***@127.0.0.1:")
    # The key, echoed back in the 500 body.
    rc = main(["sweep", "--url", echo_server, "--api-key", KEY, *common])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    run_id = json.loads(out.out)["run_id"]
    # The server did echo the key: the stored errors are 500s with the masked header.
    rows = main(["runs", "--db", str(db), "export", run_id, "--what", "requests",
                 "--format", "json"])
    exported = capsys.readouterr().out
    assert rows == 0
    errors = [r["error"] for r in json.loads(exported) if r["error"]]
    assert errors and any("Bearer ***" in e for e in errors), errors[:2]
    csv_rc = main(["runs", "--db", str(db), "export", run_id, "--what", "requests"])
    exported_csv = capsys.readouterr().out
    assert csv_rc == 0
    assert main(["runs", "--db", str(db), "show", run_id, "--json"]) == 0
    shown = capsys.readouterr()
    for secret in (KEY, URL_PASSWORD):
        blobs = [p.read_bytes() for p in db.parent.rglob("*") if p.is_file()]
        assert blobs and not any(secret.encode() in b for b in blobs), secret
        for text in (out.out, out.err, out_url.out, out_url.err, exported, exported_csv,
                     shown.out, shown.err):
            assert secret not in text


def test_error_line_is_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A one-line error that quotes the URL does not print its password.
    rc = main(["runs", "--db", str(tmp_path / "nope.db"), "list"])
    assert rc == 2
    from bstar.errors import BstarError

    def boom(args: object) -> int:
        raise BstarError(f"server unreachable at http://u:{URL_PASSWORD}@h: Bearer {KEY}")

    import bstar.commands.runs as runs_cmd

    mp = pytest.MonkeyPatch()
    mp.setattr(runs_cmd, "run_runs", boom)
    try:
        capsys.readouterr()
        assert main(["runs", "list"]) == 2
    finally:
        mp.undo()
    err = capsys.readouterr().err
    assert URL_PASSWORD not in err and KEY not in err and "u:***@h" in err
    assert len(err.strip().splitlines()) == 1


def test_credentials_in_the_url_and_an_api_key_are_one_line_not_a_traceback() -> None:
    from bstar.errors import BstarError
    from bstar.loadgen.client import OpenAIClient

    with pytest.raises(BstarError, match="not both"):
        OpenAIClient("http://user:pw@127.0.0.1:1", "m", api_key="sk-secret")
