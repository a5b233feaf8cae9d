"""JSON answers, each serialized from its model in :mod:`app.web.schemas`.

Every refusal has one shape, :class:`~app.web.schemas.Error`: ``{"error": code, "message": text}``.
"""

from __future__ import annotations

from flask import Response, jsonify
from pydantic import BaseModel

from app.web.schemas import Error


def answer(body: BaseModel, status: int = 200, **headers: str) -> Response:
    """``body`` as the JSON of the response (keys sorted, as Flask writes every JSON answer)."""
    response = jsonify(body.model_dump(mode="json", by_alias=True))
    response.status_code = status
    response.headers.update(headers)
    return response


def error(status: int, code: str, message: str, **headers: str) -> Response:
    return answer(Error(error=code, message=message), status, **headers)


def refusal(exc) -> Response:
    """An :class:`~app.errors.UploadRejected` as its answer, with ``Retry-After`` when a retry may work."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    return error(exc.status, exc.error_code, str(exc), **headers)
