"""The gate's index client reads the index a team's tools already use: the one named for pip or uv, with the
credentials netrc holds. A real HTTP index on 127.0.0.1 (PEP 503 pages, an sdist, optional Basic auth), the
gate's real client; nothing leaves the machine."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.envs import sources

VERSION = "9.9.9"
USER, PASSWORD = "team", "s3cret"


def _sdist() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (
            (f"vllm-{VERSION}/vllm/__init__.py", "__version__ = '9.9.9'\n"),
            (f"vllm-{VERSION}/vllm/engine.py", "def step():\n    return 1\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def index():
    """(the simple-index URL, the set of request paths seen); `index.auth = True` demands Basic credentials."""
    archive = _sdist()
    name = f"vllm-{VERSION}.tar.gz"
    page = f'<html><body><a href="../../files/{name}#sha256={hashlib.sha256(archive).hexdigest()}">{name}</a>'
    state = {"auth": False, "seen": []}
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["seen"].append(self.path)
            if state["auth"] and self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.end_headers()
                return
            body, ctype = {
                "/simple/vllm/": (page.encode(), "text/html"),
                f"/files/{name}": (archive, "application/gzip"),
            }.get(self.path, (None, None))
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in (*sources.INDEX_VARIABLES, "NETRC", "HARNESS_GATE_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc of this machine's user
    return monkeypatch


@pytest.mark.parametrize("variable", ["PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"])
def test_the_index_pip_or_uv_would_use_is_read(index, clean_env, tmp_path, variable):
    url, state = index
    clean_env.setenv(variable, url)
    got = sources.ensure(VERSION, tmp_path / "cache")
    assert (got.root / "vllm" / "engine.py").read_text().startswith("def step")
    assert "/simple/vllm/" in state["seen"], f"{variable} was not the index asked: {state['seen']}"


def test_harness_setting_wins_over_pip(index, clean_env, tmp_path):
    url, state = index
    clean_env.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: refused if it were asked
    clean_env.setenv("HARNESS_PYPI_URL", url)
    assert sources.ensure(VERSION, tmp_path / "cache").origin.endswith(".tar.gz")


def test_netrc_credentials_are_sent(index, clean_env, tmp_path):
    url, state = index
    state["auth"] = True
    clean_env.setenv("PIP_INDEX_URL", url)
    with pytest.raises(sources.IndexUnreachable, match="HTTP 401"):
        sources.ensure(VERSION, tmp_path / "cache")
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
    netrc.chmod(0o600)
    clean_env.setenv("NETRC", str(netrc))
    got = sources.ensure(VERSION, tmp_path / "cache")
    assert (got.root / "vllm" / "__init__.py").is_file()
