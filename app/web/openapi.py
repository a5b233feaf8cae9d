"""``GET /v1/openapi.json``: the OpenAPI 3.1 document of this API (public, no token), walked from its routes."""

from __future__ import annotations

from flask import Blueprint, current_app

from app.web.contract import document, ok, operation
from app.web.responses import answer
from app.web.schemas import ApiDocument

bp = Blueprint("openapi", __name__)


@bp.get("/v1/openapi.json")
@operation("getOpenAPI", "This document", tag="meta", database=False,
           answers={200: ok("The OpenAPI 3.1 document.", ApiDocument)})
def openapi_document():
    written = current_app.extensions.get("attache_openapi")
    if written is None:  # the routes do not change once the app serves: written once per process
        written = current_app.extensions["attache_openapi"] = ApiDocument.model_validate(document(current_app))
    return answer(written, **{"Cache-Control": "no-cache"})
