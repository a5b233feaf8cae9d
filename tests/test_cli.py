"""The ``attache`` command against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.adapters.postgres.models import audit_log
from app.cli import main
from app.core.workflow import Workflow
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
    purged = cli("dlq", "purge", "attache.inspect", "--all", "--expect", "1", "--yes", "--reason", "test", "--json")
    assert json.loads(purged.output) == {"purged": 0, "message_ids": [], "not_found": []}
    status = json.loads(cli("outbox", "status", "--json").output)
    assert status["pending"] == 0
    cleaned = json.loads(cli("gc", "run", "--dry-run", "--json").output)
    assert cleaned["dry_run"] is True and cleaned["staging_cleanup"]["removed"] == 0


def test_bad_configuration_exits_non_zero(cli, monkeypatch):
    monkeypatch.setenv("ATTACHE_MAX_UPLOAD_BYTES", "lots")
    result = cli("outbox", "status")
    assert result.exit_code == 1 and "ATTACHE_MAX_UPLOAD_BYTES" in result.output


def test_dlq_requeue_and_purge_act_only_on_what_was_chosen(cli, services, broker_url, engine):
    from tests.test_dlq import XQ, dead_letter_three, depth

    ids = dead_letter_three(services, broker_url)
    shown = cli("dlq", "show", "attache.inspect")
    assert shown.exit_code == 0 and "3 of 3 dead letter(s)" in shown.output
    for refused in (("requeue", "--all"), ("purge", "--all", "--yes"), ("purge", "--yes"),
                    ("purge", ids[0], "--all", "--expect", "3"), ("purge", ids[0], "--expect", "3", "--yes"),
                    ("purge", "--all", "--expect", "0", "--yes")):
        result = cli("dlq", refused[0], "attache.inspect", *refused[1:])
        assert result.exit_code == 2, (refused, result.output)
    assert depth(broker_url, XQ) == 3

    # another dead letter arrives after the operator counted 3
    [late] = dead_letter_three(services, broker_url, count=1)
    more = cli("dlq", "purge", "attache.inspect", "--all", "--expect", "3", "--yes")
    assert more.exit_code == 1 and "holds 4 message(s), more than the 3 confirmed" in more.output
    assert depth(broker_url, XQ) == 4
    declined = cli("dlq", "purge", "attache.inspect", ids[0], input="n\n")
    assert declined.exit_code == 1 and "delete 1 chosen message(s) of attache.inspect for good?" in declined.output
    assert depth(broker_url, XQ) == 4

    requeued = cli("dlq", "requeue", "attache.inspect", ids[1], "nope", "--reason", "fixed", "--json")
    assert requeued.exit_code == 1, "an id was not found"
    assert json.loads(requeued.output) == {"requeued": 1, "message_ids": [ids[1]], "not_found": ["nope"]}
    purged = cli("dlq", "purge", XQ, ids[0], ids[2], "--yes", "--reason", "poison")
    assert purged.exit_code == 0 and "purged 2" in purged.output
    assert depth(broker_url, XQ) == 1 and depth(broker_url, "attache.inspect") == 1
    assert [m["message_id"] for m in json.loads(cli("dlq", "show", XQ, "--json").output)] == [late]
    with engine.connect() as conn:
        rows = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert [(r.action, r.details["status"], r.details["count"]) for r in rows] == [
        ("dlq.requeue", "completed", 1), ("dlq.purge", "completed", 2)]
    assert all(r.actor.startswith("operator:cli:") for r in rows)
