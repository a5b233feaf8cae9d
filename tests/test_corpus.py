"""The whole corpus through real processes: every file gets its expected outcome.

``tests/data/MANIFEST.tsv`` and ``tests/data/phones/MANIFEST.tsv`` say what
each file should do (read through ``tests/corpus.py``); formats outside the
eight attache processes are refused at upload even where Pillow could open
them. Afterwards no worker process may have used more than a few
hundred MB.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.adapters.imaging import PROCESSED_FORMATS
from app.errors import CorruptImage, UnsupportedFormat
from tests import corpus
from tests.processes import Deployment

pytestmark = pytest.mark.processes

DATA = corpus.DATA
WORKER_MEMORY_LIMIT_MB = 400
#: A corrupt file's answer, from where it is refused (tests.corpus.CORRUPT_OUTCOME).
CORRUPT_ANSWER = {
    ("probe", UnsupportedFormat): (415, "unsupported_format"),
    ("probe", CorruptImage): (415, "corrupt_image"),
    ("render", CorruptImage): ("failed", "corrupt_image"),
}


def manifest():
    return corpus.ROWS


def processed(row) -> bool:
    return row["format"] in PROCESSED_FORMATS or row["format"] == "MPO"


def peak_rss_mb(pgid: int) -> dict[int, float]:
    peaks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks[int(entry)] = int(line.split()[1]) / 1024
    return peaks


def test_every_corpus_file_gets_its_expected_outcome(env, tmp_path):
    deployment = Deployment({**env, "WORKER_THREADS": "2"}, tmp_path)
    deployment.start("web")
    worker = deployment.start("worker")
    deployment.start("scheduler")
    try:
        accepted = {}
        refused = {}
        for row in manifest():
            response = deployment.upload(DATA / row["path"])
            if response.status_code == 202:
                accepted[row["path"]] = response.json()["id"]
            else:
                refused[row["path"]] = (response.status_code, response.json()["error"])
        finals = {path: deployment.wait_state(attachment_id, timeout=120) for path, attachment_id in accepted.items()}
        problems = []
        for row in manifest():
            path, expected = row["path"], row["expected"]
            final = finals.get(path)
            outcome = (final["state"], final["error_code"]) if final else refused[path]
            if expected == "process" and processed(row):
                ok = final is not None and final["state"] == "ready" and \
                    set(final["variants"]) == {"original", "thumbnail", "crop", "optimized"}
            elif expected in ("process", "reject_unsupported"):
                ok = outcome == (415, "unsupported_format")
            elif expected == "reject_bomb":
                ok = outcome == (413, "decompression_bomb")
            elif expected == "reject_corrupt":
                ok = outcome == CORRUPT_ANSWER[corpus.CORRUPT_OUTCOME[path]]
            else:
                ok = False
            if not ok:
                problems.append(f"{path}: expected {expected}, got {outcome}")
        assert problems == [], "\n".join(problems)
        peaks = peak_rss_mb(worker.popen.pid)
        assert peaks, "no worker process found"
        assert max(peaks.values()) < WORKER_MEMORY_LIMIT_MB, peaks
    finally:
        deployment.stop_all()
