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
    return answer(ApiDocument.model_validate(document(current_app)), **{"Cache-Control": "no-cache"})
