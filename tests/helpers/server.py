"""`fastbert serve` as a subprocess on a free port of 127.0.0.1, and the lines of its log that it
should not have printed."""
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra's client: pip install -e '.[serve]'")

# what the server may print: its own lines and uvicorn's start and stop lines
EXPECTED_LOG = re.compile(
    r"fastbert serve: .*|INFO: +(Started server process|Waiting for application (startup|shutdown)|Application "
    r"(startup|shutdown) complete|Uvicorn running on|Shutting down|Finished server process|Waiting for (connections "
    r"to close|background tasks to complete)).*")


class Server:
    def __init__(self, model_dir, tmp_path, *args):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = str(tmp_path / f"server-{self.port}.log")
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "fastbert.cli", "serve", str(model_dir), "--port", str(self.port),
               "--max-batch-tokens", "512", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}: {self.lines()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.3)
        raise AssertionError(f"the server did not start: {self.lines()}")

    def lines(self):
        with open(self.log_path) as f:
            return [ln.rstrip("\n") for ln in f if ln.strip()]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.log.close()
        return self.proc.returncode


def unexpected_lines(server):
    return [ln for ln in server.lines() if not EXPECTED_LOG.fullmatch(ln)]
