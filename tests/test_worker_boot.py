"""What a worker process loads at boot, before it says it is ready, and what a process on file storage never loads.

A module loaded in a job is paid for inside it, the GIL held: a new worker process's first jobs took 0.2-0.3 s more
CPU than the next ones (the S3 client's import, 0.16 s, with file storage; Pillow's forty plugins at its first WebP;
libvips), four times over with four worker processes (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.processes import REPO

#: what a new process has loaded after the worker's import of ``actors``, or after choosing file storage alone
LOADED = r"""
import json, sys
if sys.argv[1] == "worker":
    import actors
    storage = "storage" in vars(actors.services)  # the cached backend
else:
    from app.adapters.storage import storage_from_url
    storage = storage_from_url("file:///nonexistent/attache") is not None
from PIL import Image
from app.adapters.imaging import libvips
print(json.dumps({"storage": storage, "pillow_plugins": Image._initialized >= 2, "libvips": libvips._pyvips is not None,
                  "s3_client": "minio" in sys.modules}))
"""


def loaded(mode: str, env: dict[str, str]) -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", LOADED, mode], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_worker_process_loads_its_codecs_and_storage_at_boot(env):
    assert loaded("worker", {**os.environ, **env}) == {
        "storage": True, "pillow_plugins": True, "libvips": True, "s3_client": False}


def test_a_process_on_file_storage_never_imports_the_s3_client():
    assert loaded("file", dict(os.environ))["s3_client"] is False


def test_the_s3_backend_is_still_named_by_the_storage_package():
    from app.adapters import storage
    from app.adapters.storage.s3 import S3Storage

    assert storage.S3Storage is S3Storage
    assert isinstance(storage.storage_from_url("s3://photos"), S3Storage)


def test_a_storage_url_the_worker_cannot_use_stops_it_at_boot_with_one_line(env):
    bad = {**os.environ, **env, "STORAGE_URL": "s3://photos?endpoint=http://127.0.0.1:9&colour=blue"}
    done = subprocess.run([sys.executable, "-c", "import actors"], cwd=REPO, env=bad, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "attache worker: configuration error: STORAGE_URL has unknown parameter(s): colour")
