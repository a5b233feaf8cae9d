"""The one shape of every JSON error answer: ``{"error": code, "message": text}``."""

from __future__ import annotations

from flask import jsonify


def error(status: int, code: str, message: str, **headers: str):
    response = jsonify(error=code, message=message)
    response.status_code = status
    response.headers.update(headers)
    return response
