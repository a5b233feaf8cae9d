"""Single-node mode's figures beside RabbitMQ mode's: end to end images/s and small-photo latency.

The same measurements as :mod:`bench.system` (:func:`~bench.system.saturation`
with one worker process, :func:`~bench.system.small_photo_latency`), through
the same Procfile processes, but started as ``make up`` starts them with
nothing configured: ``DATABASE_URL`` and ``BROKER_URL`` unset, so the
processes share an embedded PostgreSQL (under a temporary
``ATTACHE_DATA_DIR``) and the PostgreSQL broker in it. Each figure's
reference is the RabbitMQ mode's figure of the same run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine

from bench.figures import Figure
from bench.system import REPO, TOKEN, Stack, saturation, small_photo_latency

#: unset for the processes (an empty value counts as unset)
UNSET = {"DATABASE_URL": "", "BROKER_URL": ""}


class SingleNodeStack(Stack):
    """An embedded PostgreSQL with the PostgreSQL broker, a storage directory, and the Procfile's processes."""

    def __init__(self, root: Path):
        from app.adapters.postgres import embedded
        from tests.processes import VENV_BIN, Deployment

        (root / "storage").mkdir()
        (root / "logs").mkdir()
        self.data_dir = str(root / "var")
        env = {**UNSET, "ATTACHE_DATA_DIR": self.data_dir, "STORAGE_URL": f"file://{root / 'storage'}",
               "ATTACHE_API_TOKENS": f"{TOKEN}=bench:uploader", "WEB_CONCURRENCY": "2"}
        subprocess.run(["attache", "db", "upgrade"], cwd=REPO, check=True, capture_output=True, timeout=120,
                       env={**os.environ, **env, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"})
        self.engine = create_engine(embedded.start(self.data_dir).replace("postgresql://", "postgresql+psycopg2://"))
        self.deployment = Deployment(env, root / "logs")
        self.deployment.token = TOKEN
        self.deployment.session.headers["Authorization"] = f"Bearer {TOKEN}"

    def close(self) -> None:
        from app.adapters.postgres import embedded

        self.deployment.stop_all()
        self.engine.dispose()
        embedded.stop(self.data_dir)


@contextlib.contextmanager
def stack() -> Iterator[tuple[SingleNodeStack, Path]]:
    with tempfile.TemporaryDirectory(prefix="attache-bench-single-") as tmp:
        root = Path(tmp)
        made = SingleNodeStack(root)
        try:
            made.deployment.start("web")
            made.deployment.start("scheduler")
            yield made, root
        finally:
            made.close()


def beside(figure: Figure, rabbitmq: list[Figure]) -> Figure:
    """``figure`` of single-node mode, with RabbitMQ mode's figure of the same measure as its reference."""
    twin = next((f for f in rabbitmq if f.measure == figure.measure), None)
    return Figure(f"single node: {figure.measure}", figure.value, figure.unit, "RabbitMQ mode, same run",
                  twin.value if twin else None, note=figure.note)


def main(rabbitmq: list[Figure]) -> list[Figure]:
    with stack() as (made, root):
        figures = small_photo_latency(made, root)
        figures = saturation(made, root, worker_processes=(1,), with_ceiling=False) + figures
    return [beside(figure, rabbitmq) for figure in figures]


if __name__ == "__main__":
    from bench.figures import table

    print(table(main([])))
