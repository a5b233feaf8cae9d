"""``GET /v1/openapi.json``: the OpenAPI 3.1 document of this API (public, no token)."""

from __future__ import annotations

from flask import Blueprint, jsonify

from app.web.api_document import document

bp = Blueprint("openapi", __name__)


@bp.get("/v1/openapi.json")
def openapi_document():
    response = jsonify(document())
    response.headers["Cache-Control"] = "no-cache"
    return response
