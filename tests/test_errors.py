"""The one exception tree: every error class of attache lives in ``app/errors.py``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import app
import app.errors
import scheduler
from app import errors

#: exception classes defined elsewhere on purpose, and why
NOT_ERRORS = {
    # a private signal inside intake (another request took the Idempotency-Key first), never raised out of it
    "app.core.intake.LostRace",
    # a pika connection error raised and translated inside the RabbitMQ adapter
    "app.adapters.broker.rabbitmq.AnswerTimeout",
}


def _every_module():
    for package in (app, scheduler):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".migrations" in info.name or info.name.endswith("__main__"):
                continue
            yield importlib.import_module(info.name)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_lives_in_app_errors():
    list(_every_module())
    elsewhere = {f"{cls.__module__}.{cls.__qualname__}" for cls in _subclasses(BaseException)
                 if cls.__module__.split(".")[0] in ("app", "scheduler", "actors")
                 and cls.__module__ != "app.errors"}
    assert elsewhere == NOT_ERRORS


@pytest.mark.parametrize("error, expected", [
    (errors.UnsupportedFormat(), False), (errors.StagingMissing(), False), (errors.InvalidMessage(), False),
    (errors.UnknownJob(), False), (errors.EffectMissing(), False), (errors.PipelineChanged(), False),
    (errors.UploadRejected(), False), (errors.JobNotFound(), False),
    (errors.StorageUnavailable(), True), (errors.DatabaseUnavailable(), True), (errors.BrokerUnavailable(), True),
    (errors.ObjectNotFound(), True), (errors.AttacheError(), True), (errors.SpoolUnavailable(), True),
    (ValueError("a bug"), True),
])
def test_the_workflow_and_the_actors_retry_by_the_class(error, expected):
    assert errors.retryable(error) is expected
    assert isinstance(error, errors.NOT_RETRYABLE) is (not expected)  # a Dramatiq actor's throws


def test_not_retryable_is_no_exception_class():
    assert not isinstance("poison", errors.NOT_RETRYABLE)
    with pytest.raises(TypeError):
        try:
            raise errors.InvalidMessage()
        except errors.NOT_RETRYABLE:  # type: ignore[misc]
            pass


@pytest.mark.parametrize("error, status", [
    (errors.UnsupportedFormat(), 415), (errors.CorruptImage(), 415), (errors.DecompressionBomb(), 413),
    (errors.ImageTooLarge(), 413), (errors.UploadRejected(), 400), (errors.IncompleteBody(), 400),
    (errors.UploadTooLarge(), 413), (errors.DigestMismatch(), 422), (errors.IdempotencyKeyReused(), 422),
    (errors.SpoolUnavailable(), 503), (errors.DatabaseUnavailable(), 503), (errors.StorageUnavailable(), 503),
    (errors.BrokerUnavailable(), 503), (errors.EffectMissing(), 500), (errors.JobNotFound(), 404),
    (errors.UnknownQueue(), 404), (errors.JobConflict(), 409), (errors.MoreThanExpected("q.XQ", 3, 2), 409),
    (errors.MissingReason(), 400), (errors.BadSelection(), 400), (errors.AttacheError(), 500),
    (errors.InvalidWebhook(), 400), (errors.WebhookTargetRefused(), 422), (errors.WebhookNotFound(), 404),
])
def test_each_class_maps_to_its_http_status_in_one_place(error, status):
    from flask import Flask

    from app.web.responses import refusal

    with Flask(__name__).app_context():
        response = refusal(error)
    assert response.status_code == status
    assert response.json["error"] == error.error_code
    assert response.headers.get("Retry-After") == ("5" if status == 503 else None)
