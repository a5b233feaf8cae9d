"""Configuration: defaults, overrides, and a bad setting stops the process with its name."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import Settings
from app.errors import ConfigError
from tests.processes import REPO


def test_defaults_match_the_design():
    settings = Settings.from_env({})
    assert settings.database_url == "" and settings.embedded_database, "unset: the embedded PostgreSQL"
    assert settings.broker_url == "" and settings.broker_kind == "postgres", "unset: the PostgreSQL broker"
    assert settings.data_dir == "var"
    assert settings.storage_url == "file://./var/storage"
    assert settings.port == 8000
    assert settings.max_upload_bytes == 50 * 1024 * 1024


@pytest.mark.parametrize("url,kind", [("amqp://guest:guest@127.0.0.1:5672/%2F", "rabbitmq"),
                                      ("amqps://h/v", "rabbitmq"), ("postgresql://h/db", "postgres")])
def test_the_broker_url_chooses_the_broker(url, kind):
    assert Settings.from_env({"BROKER_URL": url}).broker_kind == kind


@pytest.mark.parametrize("variable,value", [
    ("ATTACHE_MAX_UPLOAD_BYTES", "lots"),
    ("ATTACHE_MAX_UPLOAD_BYTES", "0"),
    ("ATTACHE_LEASE_SECONDS", "-1"),
    ("STORAGE_URL", "ftp://x"),
    ("BROKER_URL", "redis://x"),
    ("ATTACHE_FAULT", "nowhere"),
    ("ATTACHE_DEV", "maybe"),
    ("ATTACHE_DATABASE_WAIT_SECONDS", "301"),
    # float() takes these: a step's deadline of nan was never reached, and the worker died at boot on inf
    ("ATTACHE_STEP_TIME_LIMIT_SECONDS", "nan"),
    ("ATTACHE_STEP_TIME_LIMIT_SECONDS", "inf"),
    ("ATTACHE_DATABASE_WAIT_SECONDS", "nan"),
    # past PostgreSQL's intervals and timestamps: every round of the cleanup failed (a re-attack)
    ("ATTACHE_WEBHOOK_DELIVERY_RETENTION_SECONDS", "1e12"),
    ("ATTACHE_FAILED_RETENTION_SECONDS", "1e12"),
    ("ATTACHE_RETIRE_GRACE_SECONDS", "1e12"),
])
def test_bad_setting_names_the_variable(variable, value):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: value})
    assert variable in str(info.value)


def test_a_renamed_setting_stops_the_process_and_names_its_new_name():
    """ATTACHE_SMALL_IMAGE_PIXELS=0 meant "a render message per variant": ignored, every image would be made in one
    step without a word."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"ATTACHE_SMALL_IMAGE_PIXELS": "0"})
    assert "ATTACHE_SMALL_IMAGE_PIXELS" in str(info.value) and "ATTACHE_ONE_STEP_MAX_PIXELS" in str(info.value)


def test_every_setting_is_documented():
    from app.config import markdown_table

    documented = (REPO / "docs" / "configuration.md").read_text()
    assert markdown_table() in documented, "docs/configuration.md is stale: paste `python -m app.config`"


@pytest.mark.parametrize("setting", [("ATTACHE_MAX_UPLOAD_BYTES", "lots"), ("STORAGE_URL", "s3://photos?colour=blue")])
def test_the_web_stops_on_a_bad_setting_instead_of_booting_workers_for_ever(setting):
    """Its gunicorn master stayed up, its port bound, and booted a worker again 1.5 times a second, each exiting
    with the worker's status 2; ``/healthz`` hung (an adversarial run). A web worker exits with gunicorn's "failed
    to boot" status, 3, on which the master stops with it."""
    from tests.processes import free_port, procfile

    command = procfile()["web"].replace("${WEB_CONCURRENCY:-2}", "1").replace("${WEB_THREADS:-32}", "4")
    command = command.replace("${BIND:-0.0.0.0}", "127.0.0.1").replace("${PORT:-8000}", str(free_port()))
    name, value = setting
    web = subprocess.Popen(f"exec {command}", shell=True, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True,
                           env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                                "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none", name: value})
    try:
        _, stderr = web.communicate(timeout=60)
    finally:  # one that boots workers for ever is stopped with them, not left to the machine
        with contextlib.suppress(ProcessLookupError):
            os.killpg(web.pid, signal.SIGKILL)
    assert web.returncode == 3, stderr[-2000:]
    assert f"attache web: configuration error: {name}" in stderr
    assert stderr.count("Booting worker") == 1


@pytest.mark.parametrize("command", [["-m", "scheduler"], ["-c", "import actors"]])
def test_process_refuses_to_start_on_bad_setting(command):
    result = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "ATTACHE_MAX_UPLOAD_BYTES": "lots"})
    assert result.returncode == 2
    assert "ATTACHE_MAX_UPLOAD_BYTES" in result.stderr


def test_chunks_too_small_for_the_largest_upload_in_as_many_parts_as_one_may_are_a_config_error():
    """The upload page sends ATTACHE_UPLOAD_CHUNK_BYTES a PATCH, and an upload is stored in at most
    ATTACHE_MAX_PARTS_PER_UPLOAD parts: 16 KiB chunks loaded, and the page's uploads past 16 MB would have been
    refused ``too_many_parts`` after a thousand PATCHes (a re-attack)."""
    with pytest.raises(ConfigError, match="ATTACHE_UPLOAD_CHUNK_BYTES .* times ATTACHE_MAX_PARTS_PER_UPLOAD"):
        Settings.from_env({"ATTACHE_UPLOAD_CHUNK_BYTES": "16384"})
    assert Settings.from_env({"ATTACHE_UPLOAD_CHUNK_BYTES": "16384",
                              "ATTACHE_MAX_UPLOAD_BYTES": str(16384 * 1000)}).upload_chunk_bytes == 16384
