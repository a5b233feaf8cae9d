"""Job lists with filters and keyset paging: one query (find_jobs) behind /v1/ops/jobs, the CLI and /ops/jobs."""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import timedelta
from html import unescape

import pytest
from click.testing import CliRunner
from sqlalchemy import update

from app.adapters.postgres.models import jobs
from app.cli import main
from app.config import Settings
from app.core import operations, states
from app.core.operations import JobFilter
from app.web import console, create_app
from tests.conftest import OPERATOR_TOKEN, authed
from tests.test_console import signed_in
from tests.test_search import T0, make_attachment


def fail(conn, job_id, code):
    assert states.claim(conn, job_id, 1, states.Lease("worker:test", 30)) is not None
    assert states.fail(conn, job_id, 1, code, "seeded", "worker:test")


@pytest.fixture
def seeded(engine):
    """Eight jobs created a minute apart (job 0 oldest): alice's and bob's, v1 and v2, some failed.

    ===  =====  =======  ==============
    job  owner  version  state / code
    ===  =====  =======  ==============
    0    alice  1        failed corrupt_image
    1    bob    1        queued
    2    alice  1        failed worker_lost
    3    bob    2        queued
    4    alice  1        queued
    5    bob    1        failed corrupt_image
    6    alice  2        queued
    7    bob    1        queued
    ===  =====  =======  ==============
    """
    made = []
    failures = {0: "corrupt_image", 2: "worker_lost", 5: "corrupt_image"}
    with engine.begin() as conn:
        for index in range(8):
            _, [job_id] = make_attachment(conn, owner="alice" if index % 2 == 0 else "bob", minutes=index,
                                          versions=(2 if index in (3, 6) else 1,))
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(created_at=T0 + timedelta(minutes=index)))
            if index in failures:
                fail(conn, job_id, failures[index])
            made.append(str(job_id))
    return made


def listed(services, filters=JobFilter(), **kwargs) -> list[str]:
    return [j["job_id"] for j in operations.find_jobs(services.engine, filters, **kwargs)["jobs"]]


def test_each_filter_newest_first(services, seeded):
    j = seeded
    assert listed(services) == j[::-1], "newest first"
    assert listed(services, JobFilter(state="failed")) == [j[5], j[2], j[0]]
    assert listed(services, JobFilter(pipeline_version=2)) == [j[6], j[3]]
    assert listed(services, JobFilter(uploader="alice")) == [j[6], j[4], j[2], j[0]]
    assert listed(services, JobFilter(error_code="corrupt_image")) == [j[5], j[0]]
    assert listed(services, JobFilter(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=5))) == \
        [j[4], j[3], j[2]], "since included, until excluded"
    assert listed(services, JobFilter(uploader="alice", state="queued", pipeline_version=1)) == [j[4]]
    assert listed(services, JobFilter(uploader="nobody")) == []


def test_pages_follow_the_cursor_without_gaps_or_repeats_while_jobs_change(services, engine, seeded):
    j = seeded
    first = operations.find_jobs(services.engine, limit=3)
    assert [x["job_id"] for x in first["jobs"]] == [j[7], j[6], j[5]] and first["next_cursor"]
    with engine.begin() as conn:  # meanwhile: a new upload, and a listed job moves on
        make_attachment(conn, minutes=60)
        fail(conn, uuid.UUID(j[4]), "corrupt_image")
    second = operations.find_jobs(services.engine, cursor=first["next_cursor"], limit=3)
    assert [x["job_id"] for x in second["jobs"]] == [j[4], j[3], j[2]]
    third = operations.find_jobs(services.engine, cursor=second["next_cursor"], limit=3)
    assert [x["job_id"] for x in third["jobs"]] == [j[1], j[0]] and third["next_cursor"] is None
    exact = operations.find_jobs(services.engine, limit=9)
    assert len(exact["jobs"]) == 9 and exact["next_cursor"] is None, "no cursor when nothing follows"
    failed = operations.find_jobs(services.engine, JobFilter(state="failed"), limit=2)
    rest = operations.find_jobs(services.engine, JobFilter(state="failed"), cursor=failed["next_cursor"], limit=2)
    assert [x["job_id"] for x in failed["jobs"] + rest["jobs"]] == [j[5], j[4], j[2], j[0]]


def test_bad_filters_and_cursors_are_refused_by_name():
    for values, message in (({"state": "lost"}, "state must be one of"),
                            ({"pipeline_version": "v1"}, "pipeline_version must be an integer"),
                            ({"since": "yesterday"}, "since must be an ISO 8601"),
                            ({"until": "2026-13-01"}, "until must be an ISO 8601")):
        with pytest.raises(ValueError, match=message):
            JobFilter.parse(values)
    with pytest.raises(ValueError, match="since must be an ISO 8601"):
        JobFilter.parse({"since": "0001-01-01T00:00:00+01:00"})  # before the first instant Python can hold in UTC
    assert JobFilter.parse({"since": "0959-12-14T03:29:06-22:51"}).since.utcoffset() == timedelta(0), \
        "an offset PostgreSQL would refuse is turned into UTC (found by Schemathesis)"
    parsed = JobFilter.parse({"since": "2026-11-30T12:00", "until": "2026-11-30T13:00+01:00", "state": " ",
                              "uploader": "alice"})
    assert parsed.since == T0 and parsed.until == T0 and parsed.state is None
    assert JobFilter.parse(parsed.as_params()) == parsed


def test_a_forged_cursor_is_refused(services, seeded):
    for cursor in ("nonsense", "bm90IGEgY3Vyc29y", "MjAyNi0xMS0zMFQxMjowMHw=",
                   _forged("0001-01-01T00:00:00+01:00")):
        with pytest.raises(ValueError, match="cursor"):
            operations.find_jobs(services.engine, cursor=cursor)
    # offsets PostgreSQL refuses (past ±15:59, with seconds): a 500 before (an adversarial run); the same instant
    for offset in ("+20:00", "-23:59", "+05:30:15.123456"):
        assert operations.find_jobs(services.engine, cursor=_forged(f"2030-01-01T00:00:00{offset}"))["jobs"]


def _forged(created: str) -> str:
    return base64.urlsafe_b64encode(f"{created}|{uuid.uuid4()}".encode()).decode().rstrip("=")


# --- the three doors ------------------------------------------------------------------------


@pytest.fixture
def app(env):
    app = create_app(Settings.from_env({**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F"}))
    yield app
    app.extensions["attache"].close()


def test_the_api_pages_with_the_same_filters(app, seeded):
    ops = authed(app, OPERATOR_TOKEN)
    page = ops.get("/v1/ops/jobs?uploader=alice&limit=3").json
    assert [x["job_id"] for x in page["jobs"]] == [seeded[6], seeded[4], seeded[2]]
    rest = ops.get(f"/v1/ops/jobs?uploader=alice&limit=3&cursor={page['next_cursor']}").json
    assert [x["job_id"] for x in rest["jobs"]] == [seeded[0]] and rest["next_cursor"] is None
    codes = ops.get("/v1/ops/jobs?error_code=worker_lost&since=2026-11-30T12:00:00Z").json["jobs"]
    assert [x["job_id"] for x in codes] == [seeded[2]]
    for query in ("state=lost", "pipeline_version=x", "since=soon", "cursor=forged", "uploader=a%00b"):
        refused = ops.get(f"/v1/ops/jobs?{query}")
        assert refused.status_code == 400 and refused.json["error"] == "bad_request", query


@pytest.fixture
def cli(env, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def invoke(*args):
        return CliRunner().invoke(main, list(args), catch_exceptions=False, env={"COLUMNS": "200"})

    return invoke


def test_the_cli_pages_with_the_same_filters(cli, seeded):
    first = cli("jobs", "list", "--uploader", "bob", "--limit", "2", "--json")
    assert first.exit_code == 0
    assert [x["job_id"] for x in json.loads(first.stdout)] == [seeded[7], seeded[5]], "stdout is the list alone"
    cursor = re.search(r"--cursor (\S+)", first.stderr).group(1)
    second = cli("jobs", "list", "--uploader", "bob", "--limit", "2", "--cursor", cursor, "--json")
    assert [x["job_id"] for x in json.loads(second.stdout)] == [seeded[3], seeded[1]]
    assert "--cursor" not in second.stderr
    table = cli("jobs", "list", "--error-code", "corrupt_image", "--since", "2026-11-30T12:01", "--until",
                "2026-11-30T13:00")
    assert table.exit_code == 0 and seeded[5] in table.stdout and seeded[0] not in table.stdout
    assert "1 job(s)" in table.stdout
    assert cli("jobs", "list", "--since", "tomorrow").exit_code == 1


def test_the_console_lists_filters_and_pages(app, seeded, monkeypatch):
    monkeypatch.setattr(console, "JOBS_PAGE", 2)
    client = signed_in(app)
    page = client.get("/ops/jobs?state=failed")
    assert page.status_code == 200
    assert re.findall(r'href="/ops/jobs/([0-9a-f-]{36})"', page.text) == [seeded[5], seeded[2]]
    assert 'href="/ops/attachments/' in page.text
    assert '<option value="failed" selected>' in page.text, "the form shows the filter in force"
    following = unescape(re.search(r'<a href="([^"]+)" id="next-page"', page.text).group(1))
    assert "state=failed" in following and "cursor=" in following
    rest = client.get(following)
    assert re.findall(r'href="/ops/jobs/([0-9a-f-]{36})"', rest.text) == [seeded[0]]
    assert 'id="next-page"' not in rest.text and 'id="first-page"' in rest.text
    refused = client.get("/ops/jobs?since=soon")
    assert refused.status_code == 400 and "since must be an ISO 8601" in refused.text
    dashboard = client.get("/ops")
    assert 'href="/ops/jobs?state=failed"' in dashboard.text and 'href="/ops/jobs"' in dashboard.text


def test_an_uploader_s_jobs_are_found_through_an_index_however_few_they_are(engine):
    """The list joined the attachments on their owner and walked every job newest first until a page was full:
    for an uploader with few jobs or none that read the whole table (an adversarial run on 300,000 jobs: 0.8-3 s
    a request, and 44 at once held every connection of the web for 35 s). Now the job's own copy of its owner
    is indexed (migration 0014): a page reads a few blocks, whoever asks."""
    import json as json_module

    from sqlalchemy import text
    from sqlalchemy.dialects import postgresql

    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO attachments (id, owner, filename, content_type, format, size, sha256, width, height, "
            "staging_key, created_at) SELECT md5('a' || i)::uuid, CASE WHEN i = 1 THEN 'rare' ELSE 'crowd' END, "
            "'a.jpg', 'image/jpeg', 'JPEG', 1, md5('s' || i) || md5('t' || i), 1, 1, 'staging/' || i, "
            "now() - make_interval(secs => 20000 - i) FROM generate_series(1, 20000) AS i"))
        conn.execute(text(
            "INSERT INTO jobs (id, attachment_id, owner, pipeline_version, state, max_attempts, traceparent, "
            "created_at) SELECT md5('j' || i)::uuid, md5('a' || i)::uuid, CASE WHEN i = 1 THEN 'rare' ELSE 'crowd' "
            "END, 1, 'queued', 3, '00-x', now() - make_interval(secs => 20000 - i) "
            "FROM generate_series(1, 20000) AS i"))
        conn.execute(text("ANALYZE attachments; ANALYZE jobs"))
    for uploader, found in (("nobody", 0), ("rare", 1), ("crowd", 101)):
        query = operations.jobs_query(JobFilter(uploader=uploader), cursor=None, limit=100)
        sql = str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        with engine.connect() as conn:
            [[plan]] = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")).all()
        top = (json_module.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        assert top["Actual Rows"] == found
        assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 60, (uploader, top)
