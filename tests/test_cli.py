"""The ``attache`` command against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from app.adapters.postgres.models import audit_log, jobs
from app.cli import main
from app.core.workflow import Workflow
from tests.driver import run, upload
from tests.processes import REPO, VENV_BIN


@pytest.fixture
def cli(env, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def invoke(*args, input=None, columns=None):
        """``attache ARGS``; ``columns``: the terminal's width (rich reads ``COLUMNS``)."""
        return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False,
                                  env=None if columns is None else {"COLUMNS": str(columns)})

    return invoke


@pytest.fixture
def failed_job_id(quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    return str(accepted.job_id)



def test_a_reason_that_is_an_option_is_refused_and_nothing_is_done(cli, engine, quiet_services, data_file):
    """A re-attack: ``--reason --dry-run`` took the flag for the reason, and the backfill it meant to estimate ran."""
    run(Workflow(quiet_services), engine, upload(quiet_services, data_file("photos/chelsea.jpg")).job_id)
    result = cli("pipeline", "backfill", "--to", "2", "--reason", "--dry-run")
    assert result.exit_code != 0 and "is an option, not a reason" in result.output, result.output
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.pipeline_version == 2)).first() is None
    # given twice, the last one was taken and the first never looked at; a dash a document put in a flag's place
    for args in (("--reason", "--dry-run", "--reason", "ticket 42"), ("--reason", "\u2014dry-run")):
        result = cli("pipeline", "backfill", "--to", "2", *args)
        assert result.exit_code != 0 and "nothing was done" in result.output, (args, result.output)
    with engine.connect() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.pipeline_version == 2)).first() is None
    assert cli("pipeline", "backfill", "--to", "2", "--dry-run", "--reason", "estimate").exit_code == 0


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


def test_gc_run_is_audited_with_what_it_removed_and_a_dry_run_is_not(cli, engine):
    """``attache gc run`` removed objects and left no audit row, unlike every other operator action that changes
    something (an adversarial run)."""
    from app.adapters.postgres.models import audit_log

    assert cli("gc", "run", "--dry-run").exit_code == 0
    with engine.connect() as conn:
        assert conn.execute(select(audit_log)).all() == []
    ran = json.loads(cli("gc", "run", "--json").output)
    with engine.connect() as conn:
        [entry] = conn.execute(select(audit_log)).all()
    assert (entry.action, entry.target) == ("gc.run", "storage") and entry.actor.startswith("operator:cli:")
    assert entry.details == {name: counts for name, counts in ran.items() if name != "dry_run"}


def test_gc_run_that_did_not_run_says_so_and_fails(cli, engine):
    """While the scheduler's cleanup held its lock, ``attache gc run`` removed nothing and exited 0, saying only
    ``skipped=1`` among its counts (an adversarial run)."""
    from scheduler.locking import exclusive

    with exclusive(engine, "staging_cleanup") as held:
        assert held
        result = cli("gc", "run", "--json")
    assert result.exit_code == 1, result.output
    assert "staging_cleanup did not run" in result.output and "run it again" in result.output


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


# --- whole ids at any width, and id prefixes ---------------------------------------------------------------

WIDTHS = (60, 80, 120, 200)


def on_one_line(output: str, *values: str) -> bool:
    return any(all(v in line for v in values) for line in output.splitlines())


def test_jobs_list_and_show_print_whole_ids_and_timestamps_at_any_width(cli, failed_job_id):
    [listed] = json.loads(cli("jobs", "list", "--json").output)
    shown = json.loads(cli("jobs", "show", failed_job_id, "--json").output)
    for width in WIDTHS:
        table = cli("jobs", "list", columns=width)
        assert table.exit_code == 0
        assert failed_job_id in table.output and listed["updated_at"] in table.output, (width, table.output)
        assert listed["attachment_id"] in table.output or "not shown at this width: attachment" in table.output

        job = cli("jobs", "show", failed_job_id, columns=width)
        assert job.exit_code == 0
        for whole in (failed_job_id, shown["attachment_id"], shown["created_at"], shown["updated_at"],
                      shown["trace"]["traceparent"], *(h["at"] for h in shown["history"])):
            assert whole in job.output, (width, whole, job.output)
    assert on_one_line(cli("jobs", "list", columns=200).output, failed_job_id, listed["attachment_id"],
                       listed["updated_at"]), "a wide terminal shows a table of every column"
    narrower = cli("jobs", "list", columns=120).output
    assert on_one_line(narrower, failed_job_id, listed["updated_at"])
    assert "not shown at this width: attachment" in narrower


def test_every_table_prints_whole_ids_at_80_and_60_columns(cli, services, broker_url, quiet_services, data_file):
    from tests.test_dlq import XQ, dead_letter_three

    ids = dead_letter_three(services, broker_url)
    dead = {m["message_id"]: m for m in json.loads(cli("dlq", "show", "attache.inspect", "--json").output)}
    upload(quiet_services, data_file("pillow/truncated_jpeg.jpg"))  # its outbox row stays pending
    status = json.loads(cli("outbox", "status", "--json").output)
    assert status["pending"] == 1
    versions = json.loads(cli("pipeline", "list", "--json").output)
    for width in (60, 80):
        listed = cli("dlq", "list", columns=width).output
        assert XQ in listed and "attache.inspect" in listed
        shown = cli("dlq", "show", "attache.inspect", columns=width).output
        for message_id in ids:
            assert message_id in shown and dead[message_id]["body"]["job_id"] in shown, (width, shown)
        assert status["oldest_created_at"] in cli("outbox", "status", columns=width).output
        registry = cli("pipeline", "list", columns=width).output
        assert all(v["fingerprint"] in registry for v in versions) or "not shown at this width: fingerprint" in registry
    registry = cli("pipeline", "list", columns=200).output
    assert all(v["fingerprint"] in registry for v in versions), "fingerprints are whole, never cut to 16"


def test_jobs_list_in_a_real_80_column_process(env, failed_job_id):
    listed = subprocess.run([str(VENV_BIN / "attache"), "jobs", "list"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, **env, "COLUMNS": "80"}, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert failed_job_id in listed.stdout


def test_a_unique_prefix_names_a_job(cli, engine, failed_job_id):
    undashed = failed_job_id.replace("-", "")
    for prefix in (failed_job_id[:4], failed_job_id[:11], failed_job_id[:13].upper(), undashed[:10]):
        shown = cli("jobs", "show", prefix, "--json")
        assert shown.exit_code == 0 and json.loads(shown.output)["job_id"] == failed_job_id, (prefix, shown.output)
    replayed = cli("jobs", "replay", failed_job_id[:8], "--reason", "by prefix", "--json")
    assert replayed.exit_code == 0 and json.loads(replayed.output)["state"] == "queued"
    with engine.connect() as conn:
        assert conn.execute(select(audit_log.c.target)).scalar_one() == f"job:{failed_job_id}"


def test_an_ambiguous_prefix_names_the_candidates_and_does_nothing(cli, engine, failed_job_id):
    twins = ["abcd0000-0000-4000-8000-000000000001", "abcd0000-0000-4000-8000-000000000002"]
    with engine.begin() as conn:
        attachment_id, owner = conn.execute(select(jobs.c.attachment_id, jobs.c.owner)).one()
        for version, twin in enumerate(twins, start=2):
            conn.execute(insert(jobs).values(id=uuid.UUID(twin), attachment_id=attachment_id, pipeline_version=version,
                                             owner=owner, state="failed", error_code="corrupt_image", max_attempts=3,
                                             traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    for command in (("jobs", "show", "abcd0"), ("jobs", "replay", "ABCD", "--reason", "which one?")):
        result = cli(*command)
        assert result.exit_code == 1, result.output
        assert "starts 2 job ids" in result.output and all(twin in result.output for twin in twins), result.output
    with engine.connect() as conn:
        assert conn.execute(select(audit_log)).all() == [], "nothing was replayed"
        assert set(conn.execute(select(jobs.c.state).where(jobs.c.id.in_(twins))).scalars()) == {"failed"}
    shown = cli("jobs", "show", "abcd0000-0000-4000-8000-0000000000", "--json")
    assert shown.exit_code == 1 and "starts 2 job ids" in shown.output
    assert json.loads(cli("jobs", "show", twins[1], "--json").output)["job_id"] == twins[1], "a whole id is exact"


def test_an_unknown_or_malformed_prefix_is_refused(cli, failed_job_id):
    other = "0123" if not failed_job_id.startswith("0123") else "3210"
    unknown = cli("jobs", "show", other)
    assert unknown.exit_code == 1 and f"no job id starts with {other}" in unknown.output
    for bad in ("abc", "xyz12345", "abcd-1234", failed_job_id + "0"):
        refused = cli("jobs", "show", bad)
        assert refused.exit_code == 2 and "Invalid value for 'JOB_ID'" in refused.output, (bad, refused.output)


def test_dlq_requeue_and_purge_take_message_id_prefixes(cli, services, broker_url, engine):
    from tests.test_dlq import XQ, dead_letter_three, depth

    ids = dead_letter_three(services, broker_url)
    requeued = cli("dlq", "requeue", "attache.inspect", ids[0][:8], "--reason", "by prefix", "--json")
    assert requeued.exit_code == 0, requeued.output
    assert json.loads(requeued.output) == {"requeued": 1, "message_ids": [ids[0]], "not_found": []}
    purged = cli("dlq", "purge", XQ, ids[1][:6], ids[2], "ffff-not-there", "--yes", "--json")
    assert purged.exit_code == 1, "an id was not found"
    assert json.loads(purged.output) == {"purged": 2, "message_ids": [ids[1], ids[2]], "not_found": ["ffff-not-there"]}
    assert depth(broker_url, XQ) == 0 and depth(broker_url, "attache.inspect") == 1
    with engine.connect() as conn:
        chosen = [r.details["message_ids"] for r in conn.execute(select(audit_log).order_by(audit_log.c.id))]
    assert chosen == [[ids[0]], [ids[1], ids[2], "ffff-not-there"]], "the audit names whole ids"


# --- attache webhooks ---------------------------------------------------------------


def test_webhooks_add_prints_the_secret_once_and_list_never(cli, engine):
    from app.adapters.postgres.models import webhook_subscriptions

    assert cli("webhooks", "add", "http://10.0.0.7/hook", "--event", "attachment.ready").exit_code == 1, "SSRF"
    added = cli("webhooks", "add", "http://8.8.8.8/hook", "--event", "attachment.ready", "--event",
                "attachment.failed", "--uploader", "alice")
    assert added.exit_code == 0
    [secret] = re.findall(r"whsec_\S+", added.output)
    assert "shown once" in added.output
    with engine.connect() as conn:
        row = conn.execute(select(webhook_subscriptions)).one()
    assert row.secret == secret and str(row.id) in added.output
    for listed in (cli("webhooks", "list", columns=200), cli("webhooks", "list", "--json")):
        assert listed.exit_code == 0 and "http://8.8.8.8/hook" in listed.output
        assert "whsec_" not in listed.output and "secret" not in listed.output
    [entry] = json.loads(cli("webhooks", "list", "--json").output)
    assert (entry["id"], entry["uploader"], entry["events"]) == (str(row.id), "alice",
                                                                  ["attachment.failed", "attachment.ready"])
    with engine.connect() as conn:
        audited = conn.execute(select(audit_log)).one()
    assert audited.action == "webhook.register" and audited.actor.startswith("operator:cli:")


def test_webhooks_deliveries_redeliver_disable_and_enable_are_audited(cli, engine):
    from tests.test_console_webhooks import failed_delivery

    delivery_id = failed_delivery(engine)
    failing = cli("webhooks", "deliveries", columns=200)
    assert failing.exit_code == 0 and "1 deliveries" in failing.output and "internal addresses" in failing.output
    [shown] = json.loads(cli("webhooks", "deliveries", "--json").output)
    assert (shown["id"], shown["state"], shown["attempts"]) == (delivery_id, "failed", 1)
    subscription_id = shown["subscription_id"]

    assert cli("webhooks", "redeliver", str(delivery_id)).exit_code != 0, "--reason is required"
    assert cli("webhooks", "redeliver", "999999", "--reason", "x").exit_code == 1
    again = cli("webhooks", "redeliver", str(delivery_id), "--reason", "endpoint fixed")
    assert again.exit_code == 0 and "is pending" in again.output
    [pending] = json.loads(cli("webhooks", "deliveries", subscription_id, "--json").output)
    assert (pending["state"], pending["attempts"]) == ("pending", 0)
    assert json.loads(cli("webhooks", "deliveries", "--json").output) == [], "no longer failing"

    disabled = cli("webhooks", "disable", subscription_id, "--reason", "moved", "--json")
    assert disabled.exit_code == 0 and json.loads(disabled.output)["disabled_at"]
    enabled = cli("webhooks", "enable", subscription_id, "--reason", "back")
    assert enabled.exit_code == 0 and "enabled: 1 deliveries pending" in enabled.output
    assert json.loads(cli("webhooks", "list", "--json").output)[0]["disabled_at"] is None
    assert cli("webhooks", "enable", "00000000-0000-0000-0000-000000000000").exit_code == 1
    with engine.connect() as conn:
        rows = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    mine = [(r.action, r.reason) for r in rows if r.actor.startswith("operator:cli:")]
    assert mine == [("webhook.redeliver", "endpoint fixed"), ("webhook.disable", "moved"), ("webhook.enable", "back")]
    assert rows[-3].details["delivery_id"] == delivery_id and rows[-1].details["recovered_deliveries"] == 0


def test_jobs_show_prints_each_variants_provenance(cli, quiet_services, engine, data_file):
    accepted = upload(quiet_services, data_file("synthetic/exif_gps_orientation6.jpg"))
    run(Workflow(quiet_services), engine, accepted.job_id)
    shown = json.loads(cli("jobs", "show", str(accepted.job_id), "--json").output)
    made = {v["variant"]: v["provenance"] for v in shown["variants"]}
    assert set(made) == {"original", "thumbnail", "crop", "optimized"}
    table = cli("jobs", "show", str(accepted.job_id), columns=80)
    assert table.exit_code == 0 and "variants and their provenance" in table.output
    records = {block.split()[1]: block for block in table.output.split("\n\n") if block.startswith("variant ")}
    assert set(records) == set(made), "one record per variant"
    for name, record in records.items():
        assert on_one_line(record, "source sha256", made[name]["source"]["sha256"][:16])
        assert on_one_line(record, "pipeline", f"v1 {made[name]['pipeline']['fingerprint'][:12]}")
    thumbnail = records["thumbnail"]
    assert on_one_line(thumbnail, "spec", "kind=fit", "width=256")
    assert on_one_line(thumbnail, "encoder", "format=JPEG", "quality=85")
    assert on_one_line(thumbnail, "libraries", f"Pillow={made['thumbnail']['libraries']['Pillow']}")
    assert on_one_line(thumbnail, "stripped", "gps=True", "GPSInfo")
    assert on_one_line(records["original"], "spec", "the uploaded bytes, unchanged")


def test_the_release_and_the_cleanups_end_with_a_message_when_the_database_does_not_answer(env):
    """Adversarial runs: ``attache db upgrade`` (the Procfile's ``release``) against a server that took the connection
    and never answered waited for good (its connections had no connect timeout), and ``attache gc run`` with the
    database down printed a psycopg2 traceback. Both now end with a message and exit status 1."""
    from tests.tcp import Listener

    silent = Listener()
    target = urlsplit(env["DATABASE_URL"])
    try:
        silent_url = f"postgresql://{target.username}@127.0.0.1:{silent.port}{target.path}"
        down_url = f"postgresql://{target.username}@127.0.0.1:1{target.path}"
        for url, args in ((silent_url, ("db", "upgrade")), (down_url, ("db", "upgrade", "--no-create")),
                          (down_url, ("gc", "run"))):
            began = time.monotonic()
            ended = subprocess.run([str(VENV_BIN / "attache"), *args], cwd=REPO, capture_output=True, text=True,
                                   env={**os.environ, **env, "DATABASE_URL": url}, timeout=60)
            assert ended.returncode == 1, (args, ended.stderr)
            assert "Traceback" not in ended.stderr and "Error:" in ended.stderr, (args, ended.stderr)
            assert time.monotonic() - began < 30, args
    finally:
        silent.close()


def test_the_cli_waits_for_an_answer_as_the_scheduler_does_and_a_frozen_release_frees_its_locks(env):
    """A re-attack: ``webhooks list`` and ``gc run`` waited for good on a database frozen mid-statement, and a
    release frozen mid-migration held ``step_runs`` locked (every worker's step record waited) until killed. The
    CLI's connections have the scheduler's answer deadline; the release's, which may run long statements, none,
    but the server ends its session once it has waited for the release between statements for a minute."""
    from sqlalchemy import create_engine, make_url, text

    from app.adapters.postgres.db import release_connect_args
    from app.config import Settings
    from app.services import Services

    cli = Services(Settings.from_env(env), process="cli")
    assert cli._answer_deadline == (cli.settings.background_answer_seconds, "ATTACHE_BACKGROUND_ANSWER_SECONDS")
    url = make_url(env["DATABASE_URL"]).set(drivername="postgresql+psycopg2")
    engine = create_engine(url, connect_args=release_connect_args(url))
    with engine.connect() as conn:
        assert conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "1min"
        assert conn.execute(text("SHOW application_name")).scalar() == "attache release"
    engine.dispose()
