"""RabbitMQ vhosts for tests, made and removed in batches.

Each test that uses the broker gets a vhost of its own. ``rabbitmqctl``
starts an Erlang VM for every call (about 0.7 s here), so a vhost made and
removed with ``add_vhost``/``set_permissions``/``delete_vhost`` cost each
test about 2 s: 10 minutes of a 300-test suite. One ``rabbitmqctl eval``
makes or removes a whole batch in one VM start; a vhost is still used by
exactly one test and removed after it.
"""

from __future__ import annotations

import subprocess
import uuid

BATCH = 24
USER = "guest"


def _erlang_names(names: list[str]) -> str:
    return "[" + ",".join(f'<<"{name}">>' for name in names) + "]"


def _eval(code: str) -> None:
    result = subprocess.run(["rabbitmqctl", "-q", "eval", code], capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or result.stdout.strip() != "ok":
        raise RuntimeError(f"rabbitmqctl eval failed ({result.returncode}): {result.stdout}{result.stderr}")


def create(names: list[str]) -> None:
    _eval(f"lists:foreach(fun(V) -> ok = rabbit_vhost:add(V, <<\"attache-tests\">>), "
          f"ok = rabbit_auth_backend_internal:set_permissions(<<\"{USER}\">>, V, <<\".*\">>, <<\".*\">>, "
          f"<<\".*\">>, <<\"attache-tests\">>) end, {_erlang_names(names)}), ok.")


def delete(names: list[str]) -> None:
    _eval(f"lists:foreach(fun(V) -> rabbit_vhost:delete(V, <<\"attache-tests\">>) end, "
          f"{_erlang_names(names)}), ok.")


class VhostPool:
    """Hands out fresh vhosts, made ``BATCH`` at a time; removes used ones a batch at a time."""

    def __init__(self, batch: int = BATCH):
        self.batch = batch
        self.fresh: list[str] = []
        self.used: list[str] = []

    def take(self) -> str:
        if not self.fresh:
            names = [f"attache_test_{uuid.uuid4().hex[:10]}" for _ in range(self.batch)]
            create(names)
            self.fresh = names
        return self.fresh.pop()

    def give_back(self, name: str) -> None:
        self.used.append(name)
        if len(self.used) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self.used:
            names, self.used = self.used, []
            delete(names)

    def close(self) -> None:
        self.used += self.fresh
        self.fresh = []
        self.flush()
