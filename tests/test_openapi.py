"""The OpenAPI document (``GET /v1/openapi.json``) is valid, complete and true.

* valid: the served document validates as OpenAPI 3.1;
* complete: it names exactly the Flask routes under ``/v1`` plus ``/healthz``,
  ``/readyz`` and ``/metrics`` (a new route without documentation fails here);
* true: Schemathesis, run against the real web process (gunicorn, from the
  Procfile), finds no server error and no status, content type, header or
  body the document does not describe.
"""

from __future__ import annotations

import io
import re
import time
import uuid

import pika
import pytest
import requests
from dramatiq.message import Message
from PIL import Image
from sqlalchemy import insert, update

from app.adapters.postgres.models import dead_letters, jobs
from app.web import create_app
from app.web.contract import document
from tests.conftest import OPERATOR_TOKEN, UPLOADER_TOKEN, authed
from tests.processes import Deployment, wait_for

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
PUBLIC_OPERATIONS = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/openapi.json"), ("OPTIONS", "/v1/uploads")}
#: the routes outside /v1 that are part of the API (the HTML pages / and /ops... are not)
API_ROUTES_OUTSIDE_V1 = {"/healthz", "/readyz", "/metrics"}


def documented_operations(doc: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item
            if method in HTTP_METHODS}


def flask_api_routes(app) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every API route: ``<uuid:x>``, ``<x>``, ``<int:x>`` become ``{x}``."""
    routes = set()
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        if not (path == "/v1" or path.startswith("/v1/") or path in API_ROUTES_OUTSIDE_V1):
            continue
        # HEAD and OPTIONS count where a view declares them, not where Flask adds them to every route
        automatic = ({"OPTIONS"} if rule.provide_automatic_options else set()) | ({"HEAD"} if "GET" in rule.methods
                                                                                  else set())
        routes |= {(method, path) for method in rule.methods - automatic}
    return routes


@pytest.fixture
def app(settings):
    return create_app(settings)


def test_served_document_is_valid_openapi_3_1(app):
    from openapi_spec_validator import OpenAPIV31SpecValidator, validate

    response = app.test_client().get("/v1/openapi.json")  # public: no token
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    served = response.get_json()
    assert served["openapi"] == "3.1.0"
    validate(served, cls=OpenAPIV31SpecValidator)
    assert served == document(app)


def test_the_document_is_written_once_and_revalidated_by_its_etag(app):
    """Serialized for each request, its 105 KB cost the web 4 ms of CPU a request: 3,000 requests without a token
    took 11 s of it, and held an honest upload back (an adversarial run)."""
    import time

    client = app.test_client()
    first = client.get("/v1/openapi.json")
    assert first.status_code == 200 and first.headers["ETag"] and first.headers["Cache-Control"] == "no-cache"
    began = time.process_time()
    again = [client.get("/v1/openapi.json") for _ in range(50)]
    per_request = (time.process_time() - began) / 50
    assert all(answer.data == first.data for answer in again)
    assert per_request < 0.002, f"{per_request * 1000:.1f} ms of CPU a request: the document is written each time"
    not_modified = client.get("/v1/openapi.json", headers={"If-None-Match": first.headers["ETag"]})
    assert not_modified.status_code == 304 and not_modified.data == b""


def test_document_names_exactly_the_flask_routes(app):
    routes = flask_api_routes(app)
    documented = documented_operations(document(app))
    assert ("POST", "/v1/attachments") in routes and ("GET", "/metrics") in routes  # the conversion works
    assert routes - documented == set(), "API routes whose view declares no @operation (app/web/contract.py)"
    assert documented - routes == set(), "documented operations the app does not have"


def test_a_route_whose_view_declares_no_operation_is_missing_from_the_document(settings):
    """The walker documents only views with an @operation, so the test above catches a new undocumented route."""
    from flask import Blueprint

    extra = Blueprint("extra", __name__)
    extra.add_url_rule("/v1/extra/<int:n>", "extra", lambda n: "")
    app = create_app(settings)
    app.register_blueprint(extra)
    assert flask_api_routes(app) - documented_operations(document(app)) == {("GET", "/v1/extra/{n}")}


def test_security_is_declared_where_the_code_enforces_it(app):
    """Bearer on everything but the probes and the document itself; 401 (and 403 for operator routes)."""
    doc = document(app)
    assert doc["components"]["securitySchemes"]["bearer"] == {
        **doc["components"]["securitySchemes"]["bearer"], "type": "http", "scheme": "bearer"}
    client = app.test_client()
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            key = (method.upper(), path)
            concrete = (path.replace("{attachment_id}", str(uuid.uuid4())).replace("{job_id}", str(uuid.uuid4()))
                        .replace("{name}", "thumbnail").replace("{queue}", "attache.inspect")
                        .replace("{version}", "1").replace("{upload_id}", str(uuid.uuid4()))
                            .replace("{subscription_id}", str(uuid.uuid4())).replace("{delivery_id}", "1"))
            if key in PUBLIC_OPERATIONS:
                assert operation["security"] == [], key
                continue
            assert operation["security"] == [{"bearer": []}], key
            assert "401" in operation["responses"], key
            assert client.open(concrete, method=method.upper()).status_code == 401, key
            operator_only = path.startswith("/v1/ops") or path == "/metrics"
            assert ("403" in operation["responses"]) == operator_only, key
            if operator_only:
                uploader = authed(app, UPLOADER_TOKEN)
                assert uploader.open(concrete, method=method.upper()).status_code == 403, key


# --- Schemathesis against the live web process ---------------------------------------------------

MAX_EXAMPLES = 30  # per operation: ~20 s against the live process on a 2-core machine (50 took 36 s)
KEEP, REMOVE = object(), object()  # what an override may do besides setting a value


def _png(colour: str, size=(40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def _upload(deployment: Deployment, data: bytes, name: str) -> dict:
    response = deployment.session.post(deployment.url + "/v1/attachments", files={"file": (name, data)}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()


def _dead_letter(services, broker_url: str, engine) -> None:
    """One job message rejected into ``attache.inspect.XQ`` (RabbitMQ adds x-death), with its recorded reason."""
    payload = {"job_id": str(uuid.uuid4()), "step": "inspect", "attempt": 1}
    message = Message(queue_name="attache.inspect", actor_name="inspect", args=(payload,), kwargs={}, options={})
    services.broker.enqueue(message)
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        method, _properties, _body = wait_for(lambda: (lambda got: got if got[0] else None)(
            channel.basic_get("attache.inspect", auto_ack=False)), timeout=10, message="the message to reject")
        channel.basic_reject(method.delivery_tag, requeue=False)
    finally:
        connection.close()
    with engine.begin() as conn:
        conn.execute(insert(dead_letters).values(
            message_id=message.message_id, queue_name="attache.inspect", actor_name="inspect",
            job_id=uuid.UUID(payload["job_id"]), error_code="unknown_job", reason="no such job", retries=0))


@pytest.fixture
def live(env, tmp_path, services, broker_url, engine):
    """The web process, with data for the generated requests to find.

    * ``ready``: an attachment processed by a real worker (variants published);
    * ``failed``: an attachment whose job is ``failed`` (a replay can succeed once);
    * one dead letter in ``attache.inspect.XQ`` with its recorded reason.

    The worker is stopped before Schemathesis runs, so what it sees does not
    change underneath it.
    """
    deployment = Deployment(env, tmp_path)
    deployment.session.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
    try:
        deployment.start("web")
        deployment.start("worker")
        ready = _upload(deployment, _png("red"), "red.png")
        status = deployment.wait_state(ready["id"], timeout=90)
        assert status["state"] == "ready", status
        deployment.processes["worker"].stop()
        failed = _upload(deployment, _png("blue"), "blue.png")
        with engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == uuid.UUID(failed["job_id"])).values(
                state="failed", error_code="corrupt_image", error_reason="seeded by test_openapi"))
        _dead_letter(services, broker_url, engine)
        resumable = [deployment.session.post(deployment.url + "/v1/uploads", timeout=10, headers={
            "Tus-Resumable": "1.0.0", "Upload-Length": "1000000"}).headers["Location"].rsplit("/", 1)[1]
            for _ in range(10)]  # several: DELETE (first in the served order) ends the ones it picks

        yield {
            "deployment": deployment,
            "attachment_id": [ready["id"], failed["id"]],
            "job_id": [ready["job_id"], failed["job_id"]],
            "name": sorted(status["variants"]),
            "If-None-Match": [f'"{status["variants"]["original"]["sha256"]}"'],
            "Range": ["bytes=0-9", "bytes=-16", "bytes=10-", "bytes=100000000-", "bytes=5-2"],
            "upload_id": resumable,
        }
    finally:
        deployment.stop_all()


@pytest.mark.processes
def test_schemathesis_finds_the_live_api_as_documented(live):
    import hypothesis
    import schemathesis
    from hypothesis import strategies as st
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    deployment: Deployment = live["deployment"]
    served = requests.get(deployment.url + "/v1/openapi.json", timeout=10).json()
    # from_dict, not from_url: Schemathesis leaves out the operation its schema was loaded from
    schema = schemathesis.openapi.from_dict(served)
    schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")  # tus PATCH bodies
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
              response_schema_conformance]
    settings = hypothesis.settings(
        max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],  # a failure is reported as found, unshrunk
        suppress_health_check=list(hypothesis.HealthCheck), print_blob=False,
    )
    # Generated ids rarely name anything: now and then use one that exists (listed first: Hypothesis favours it).
    overrides = [
        ("path_parameters", "attachment_id", [*live["attachment_id"], KEEP]),
        ("path_parameters", "job_id", [*live["job_id"], KEEP]),
        ("path_parameters", "name", [*live["name"], KEEP]),
        ("path_parameters", "upload_id", [*live["upload_id"], KEEP]),
        ("query", "version", [REMOVE, KEEP, 1]),
        ("headers", "Range", [KEEP, *live["Range"]]),
        ("headers", "If-None-Match", [KEEP, *live["If-None-Match"]]),
    ]
    session = requests.Session()
    failures: list[str] = []
    statuses: dict[str, set[int]] = {}
    started = time.monotonic()

    for result in schema.get_all_operations():
        operation = result.ok()
        declared = {"path_parameters": {p.name for p in operation.path_parameters},
                    "query": {p.name for p in operation.query}, "headers": {p.name for p in operation.headers}}
        last: dict = {}

        @hypothesis.given(case=operation.as_strategy(), data=st.data())
        @settings
        def run(case, data):
            for location, name, choices in overrides:
                if name not in declared[location]:
                    continue
                chosen = data.draw(st.sampled_from(choices), label=name)
                values = dict(getattr(case, location) or {})
                if chosen is REMOVE:
                    values.pop(name, None)
                elif chosen is not KEEP:
                    values[name] = chosen
                setattr(case, location, values)
            last["case"] = case
            response = case.call_and_validate(base_url=deployment.url, session=session, checks=checks,
                                              headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30)
            statuses.setdefault(operation.label, set()).add(response.status_code)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # a report for every operation, not just the first failing
            case = last.get("case")
            failures.append(f"{operation.label}: {exc}\n{case.as_curl_command() if case is not None else ''}")

    elapsed = time.monotonic() - started
    summary = "\n".join(f"{label}: {sorted(codes)}" for label, codes in sorted(statuses.items()))
    print(f"\nschemathesis: {len(statuses)} operations in {elapsed:.1f}s\n{summary}")
    assert not failures, "\n\n".join(failures) + "\n\n" + deployment.logs()
    assert {op for op in statuses} == {f"{m} {p}" for m, p in documented_operations(served)}
    # the seeded data was reached: a download, a range, a successful replay and a dead letter were seen
    assert 200 in statuses["GET /v1/attachments/{attachment_id}/variants/{name}"]
    assert 206 in statuses["GET /v1/attachments/{attachment_id}/original"] | \
        statuses["GET /v1/attachments/{attachment_id}/variants/{name}"]
    assert 200 in statuses["POST /v1/ops/jobs/{job_id}/replay"]
    assert 202 in statuses["POST /v1/attachments"]


# --- app bugs found while writing the document, fixed: each input gets a clear answer, never a 500 --------

FOUND_BUGS = [
    pytest.param("/v1/attachments", {"data": b"x", "headers": {"Content-Type": "application/octet-stream",
                                                                "Content-MD5": "\u00e9"}}, 400,
                 id="upload-content-md5-not-ascii"),
    pytest.param("/v1/attachments", {"data": _png("green"), "headers": {"Content-Type": "image/png",
                                                                        "tracestate": "a" * 600}}, 202,
                 id="upload-tracestate-over-512-is-dropped"),
    pytest.param("/v1/ops/dlq/attache.inspect/purge", {"json": {"reason": {"why": "x"}}}, 400,
                 id="dlq-purge-reason-not-a-string"),
    pytest.param("/v1/ops/dlq/attache.inspect/requeue", {"json": {"reason": [1, "x"]}}, 400,
                 id="dlq-requeue-reason-not-a-string"),
    pytest.param("/v1/ops/dlq/attache.inspect/purge", {"json": {"message_ids": ["x"], "reason": "a\u0000b"}}, 200,
                 id="dlq-purge-reason-with-nul-is-cleaned"),
    pytest.param("/v1/ops/dlq/attache.inspect/purge", {"json": {"message_ids": ["x", "a\u0000b"]}}, 400,
                 id="dlq-purge-message-id-with-nul-is-refused"),
    pytest.param("/v1/ops/dlq/attache.inspect/requeue", {"json": {"message_ids": ["\ud9d0"]}}, 400,
                 id="dlq-requeue-message-id-lone-surrogate-is-refused"),
]


@pytest.mark.parametrize(("path", "request_kwargs", "status"), FOUND_BUGS)
def test_inputs_that_once_broke_the_app(app, path, request_kwargs, status):
    response = authed(app, OPERATOR_TOKEN).post(path, **request_kwargs)
    assert response.status_code == status, response.get_data(as_text=True)


def test_database_down_is_503_everywhere(env):
    from app.config import Settings

    down = create_app(Settings.from_env({**env, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/attache"}))
    client = authed(down, OPERATOR_TOKEN)
    for path in ("/v1/attachments/00000000-0000-4000-8000-000000000000", "/v1/ops/jobs", "/v1/ops/outbox",
                 "/metrics"):
        response = client.get(path)
        assert response.status_code == 503 and response.headers["Retry-After"] == "5", path
        assert response.json["error"] == "database_unavailable"
    down.extensions["attache"].close()
