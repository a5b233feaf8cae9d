"""A RabbitMQ node of a test's own, that the test may stop and start.

The machine's node serves every other test's vhost; a chaos run that stops
the broker uses a second node started from the same installation with its
own name, port, data directory and no plugins. ``stop_app``/``start_app``
stop and start the broker inside the running Erlang node, as an operator
restarting RabbitMQ would; queues and persistent messages survive.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.processes import free_port


class PrivateRabbit:
    def __init__(self):
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"attache{uuid.uuid4().hex[:8]}@localhost"
        self.root = Path(tempfile.mkdtemp(prefix="attache-rabbit-"))
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam("rabbitmq")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "RABBITMQ_NODENAME": self.node, "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq"),
                "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"), "RABBITMQ_LOG_BASE": str(self.root / "log"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(self.root / "pid")}

    def ctl(self, *args: str, check: bool = True, timeout: float = 120):
        return subprocess.run(["rabbitmqctl", "-q", "-n", self.node, *args], check=check, capture_output=True,
                              timeout=timeout)

    def _wait_port(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"RabbitMQ node {self.node} did not open port {self.port}; see {self.root}/log")

    def start(self) -> None:
        subprocess.run(["rabbitmq-server", "-detached"], env=self._env(), check=True, capture_output=True,
                       timeout=60)
        self._wait_port()

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        self._wait_port()

    def destroy(self) -> None:
        self.ctl("stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
