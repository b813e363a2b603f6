"""`mha serve` in a child process of its own session, on a free loopback port (mha_runtime.serve.ports): what
the tests and the serve bench start and stop. Stopping sends SIGTERM (the server drains and exits), then kills
whatever of the session is still there, so no Ray process outlives it."""
from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from mha_runtime.artifact.errors import ServeError
from mha_runtime.serve.ports import free_port


def session_members(sid: int) -> list[int]:
    """Processes of session `sid` (the server and every Ray process it started)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except OSError:  # gone meanwhile
                pass
    return members


class ServerProcess:
    """Start with `with ServerProcess(artifact, log_dir, "--max-batch", "8") as server:`; `server.url` is ready.

    Ray's files (temp dir, ~/.ray/auth_token) go under `home`, which becomes the child's HOME (and `home`/t its
    RAY_TMPDIR); keep it short: Ray adds about 70 characters to it for its sockets, whose paths must stay
    under 107.
    """

    def __init__(self, artifact: Path, log_dir: Path, *args: str, home: Path | None = None,
                 port: int | None = None, ready_timeout_s: float = 180.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = Path(log_dir)
        self.ready_timeout_s = ready_timeout_s
        self.command = [sys.executable, "-m", "mha_runtime", "serve", str(artifact), "--host", "127.0.0.1",
                        "--port", str(self.port), *args]
        self.env = dict(os.environ)
        if home is not None:
            (Path(home) / "t").mkdir(parents=True, exist_ok=True)
            self.env.update(HOME=str(home), RAY_TMPDIR=str(Path(home) / "t"))
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.leftovers: list[int] = []

    def start(self) -> ServerProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "stdout.txt", "wb") as out, open(self.log_dir / "stderr.txt", "wb") as err:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServeError(f"mha serve exited with status {self.returncode} before it was ready: "
                                 f"{self.stderr().strip().splitlines()[-1:] or ''}")
            if self.stdout().startswith("serving ") and self.healthy():  # it says it is ready, and it is
                return self
            time.sleep(0.2)
        self.stop()
        raise ServeError(f"mha serve was not ready after {self.ready_timeout_s:g} s")

    def healthy(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", "/v1/health")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def terminate(self) -> None:
        """SIGTERM to the server alone: it drains and exits on its own."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGTERM, wait, then SIGKILL what is left of the session; the server's exit status."""
        if self.process is None:
            return None
        self.terminate()
        try:
            self.returncode = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.returncode = None
        deadline = time.monotonic() + 10
        while (members := session_members(self.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)  # Ray's processes exit a moment after the server
        self.leftovers = members
        if members:  # the safety net: the group, then each member by pid
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid in session_members(self.process.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.returncode is None:
            self.returncode = self.process.wait(10)
        return self.returncode

    def stdout(self) -> str:
        return (self.log_dir / "stdout.txt").read_text(errors="replace")

    def stderr(self) -> str:
        return (self.log_dir / "stderr.txt").read_text(errors="replace")

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
