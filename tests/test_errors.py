"""The one exception tree: every error class of attache lives in ``app/errors.py``."""

from __future__ import annotations

import importlib
import pkgutil

import app
import app.errors
import scheduler

#: exception classes defined elsewhere on purpose, and why
NOT_ERRORS = {
    # a private signal inside intake (another request took the Idempotency-Key first), never raised out of it
    "app.core.intake._LostRace",
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
