"""The ``attache`` command against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.cli import main
from app.models import audit_log
from app.workflow import Workflow
from tests.driver import run, upload


@pytest.fixture
def cli(env, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def invoke(*args, input=None):
        return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def failed_job_id(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    return str(accepted.job_id)



def test_jobs_list_show_and_replay(cli, engine, failed_job_id):
    result = cli("jobs", "list", "--state", "failed", "--json")
    assert result.exit_code == 0
    assert [j["job_id"] for j in json.loads(result.output)] == [failed_job_id]
    table = cli("jobs", "list", "--state", "failed")
    assert table.exit_code == 0 and "1 job(s)" in table.output and "corrupt_im" in table.output
    shown = json.loads(cli("jobs", "show", failed_job_id, "--json").output)
    assert [h["to"] for h in shown["history"]] == ["queued", "processing", "failed"]
    assert cli("jobs", "replay", failed_job_id).exit_code != 0, "--reason is required"
    replayed = cli("jobs", "replay", failed_job_id, "--reason", "retry after fix", "--json")
    assert replayed.exit_code == 0 and json.loads(replayed.output)["state"] == "queued"
    again = cli("jobs", "replay", failed_job_id, "--reason", "twice")
    assert again.exit_code == 1 and "only a failed job" in again.output
    with engine.connect() as conn:
        entry = conn.execute(select(audit_log)).one()
    assert entry.action == "job.replay" and entry.actor.startswith("operator:cli:") and entry.reason == "retry after fix"


def test_unknown_job_exits_non_zero(cli):
    result = cli("jobs", "show", "00000000-0000-4000-8000-000000000000")
    assert result.exit_code == 1 and "no job" in result.output


def test_dlq_outbox_and_gc(cli, services):
    services.broker.declare_queue("attache.inspect", ensure=True)
    queues = json.loads(cli("dlq", "list", "--json").output)
    assert {q["name"]: q["messages"] for q in queues}["attache.inspect.XQ"] == 0
    assert json.loads(cli("dlq", "show", "attache.inspect", "--json").output) == []
    assert cli("dlq", "requeue", "attache.inspect").exit_code != 0, "ids or --all"
    assert cli("dlq", "show", "nonsense").exit_code == 1
    purged = cli("dlq", "purge", "attache.inspect", "--yes", "--reason", "test", "--json")
    assert json.loads(purged.output) == {"purged": 0}
    status = json.loads(cli("outbox", "status", "--json").output)
    assert status["pending"] == 0
    cleaned = json.loads(cli("gc", "run", "--dry-run", "--json").output)
    assert cleaned["dry_run"] is True and cleaned["staging_cleanup"]["removed"] == 0


def test_bad_configuration_exits_non_zero(cli, monkeypatch):
    monkeypatch.setenv("ATTACHE_MAX_UPLOAD_BYTES", "lots")
    result = cli("outbox", "status")
    assert result.exit_code == 1 and "ATTACHE_MAX_UPLOAD_BYTES" in result.output
