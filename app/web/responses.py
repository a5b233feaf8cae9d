"""The one shape of every JSON error answer: ``{"error": code, "message": text}``."""

from __future__ import annotations

from flask import jsonify


def error(status: int, code: str, message: str, **headers: str):
    response = jsonify(error=code, message=message)
    response.status_code = status
    response.headers.update(headers)
    return response


def refusal(exc) -> object:
    """An :class:`~app.errors.UploadRejected` as its answer, with ``Retry-After`` when a retry may work."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    return error(exc.status, exc.error_code, str(exc), **headers)
