"""The API contract: each view declares its operation, and the OpenAPI 3.1 document is walked from the routes.

A view carries an :func:`operation` (summary, parameters, request body and
answers); the bodies are the models of :mod:`app.web.schemas`, the same ones
its answers are serialized through. :func:`document` walks the app's URL map
and writes each documented route, the models' JSON schemas (pydantic) as its
components, and what the code around the view enforces:

* path parameters from the rule's converters (``uuid``, ``int``, a plain segment);
* security, ``401`` and ``403`` from the blueprint's :func:`~app.web.access.protect`;
* ``503 database_unavailable`` where the operation uses PostgreSQL (the app-wide handler);
* ``413 too_large`` where it reads a JSON body (:data:`~app.web.request.FORM_MAX_BYTES`).

``tests/test_openapi.py`` keeps the document equal to the routes (an API route
without an operation fails it), valid OpenAPI 3.1, and true: Schemathesis runs
it against the live web process. The HTML pages (``/`` and ``/ops``) are not
part of the API and carry no operation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Annotated, Any, Callable, Mapping, TypeVar
from uuid import UUID

from flask import Flask
from pydantic import BaseModel, Field, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from app.web import reads_in_flight
from app.web.access import protection
from app.web.request import FORM_MAX_BYTES
from app.web.schemas import Error

JSON = "application/json"
BEARER = [{"bearer": []}]
VIEW_ATTRIBUTE = "attache_operation"

View = TypeVar("View", bound=Callable)


class _Untitled(GenerateJsonSchema):
    """pydantic's JSON schemas without the ``title`` it derives from every name (the names say it)."""

    def generate(self, schema, mode="validation"):
        return _untitled(super().generate(schema, mode))

    def generate_definitions(self, inputs):
        mapping, definitions = super().generate_definitions(inputs)
        return mapping, _untitled(definitions)


def _untitled(schema: Any) -> Any:
    """``schema`` without its ``title`` keywords (a property named ``title`` maps to a schema, and stays)."""
    if isinstance(schema, dict):
        return {key: _untitled(value) for key, value in schema.items()
                if not (key == "title" and isinstance(value, str))}
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    return schema


def json_schema(python_type: Any) -> dict:
    """The JSON schema of a Python type (``int``, ``UUID``, ``Literal[...]``, ``Annotated[str, Field(...)]``)."""
    return TypeAdapter(python_type).json_schema(schema_generator=_Untitled)


# --- what a view declares -----------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """A parameter in the path, the query or a header; its schema is its Python type's."""

    name: str
    where: str  # "path", "query" or "header"
    description: str | None = None
    type: Any = str
    default: Any = None

    def document(self) -> dict:
        schema = json_schema(self.type)
        if self.default is not None:
            schema["default"] = self.default
        out: dict[str, Any] = {"name": self.name, "in": self.where, "required": self.where == "path"}
        if self.description:
            out["description"] = self.description
        out["schema"] = schema
        return out


def in_path(name: str, description: str | None = None, type: Any = None) -> Param:
    """A path parameter's description (and a narrower type than its converter's)."""
    return Param(name, "path", description, type)


def in_query(name: str, description: str, type: Any = str, default: Any = None) -> Param:
    return Param(name, "query", description, type, default)


def in_header(name: str, description: str, type: Any = str) -> Param:
    return Param(name, "header", description, type)


@dataclass(frozen=True)
class Header:
    """A response header."""

    description: str
    type: Any = str
    required: bool = False

    def document(self) -> dict:
        out: dict[str, Any] = {"description": self.description, "schema": json_schema(self.type)}
        if self.required:
            out["required"] = True
        return out


RETRY_AFTER = {"Retry-After": Header("Seconds to wait before retrying (always `5`).",
                                     Annotated[str, Field(pattern="^[0-9]+$")])}


@dataclass(frozen=True)
class Answer:
    """One documented response: a JSON body of ``models`` (one of them), raw ``content``, or no body."""

    description: str
    models: tuple[type[BaseModel], ...] = ()
    codes: tuple[str, ...] = ()  # an Error answer: the codes it can carry
    headers: Mapping[str, Header] = field(default_factory=dict)
    content: Mapping[str, Any] | None = None


def ok(description: str, *models: type[BaseModel], headers: Mapping[str, Header] | None = None) -> Answer:
    return Answer(description, models, headers=headers or {})


def refused(description: str, *codes: str, retry_after: bool = False) -> Answer:
    """A refusal: the :class:`~app.web.schemas.Error` body, with the ``error`` codes it can carry."""
    listed = ", ".join(f"`{code}`" for code in codes)
    return Answer(f"{description.rstrip('.')} (`error`: {listed}).", (Error,), codes,
                  RETRY_AFTER if retry_after else {})


def raw(description: str, content: Mapping[str, Any] | None = None,
        headers: Mapping[str, Header] | None = None) -> Answer:
    """A response whose body is not JSON (bytes, text) or that has none."""
    return Answer(description, headers=headers or {}, content=content)


@dataclass(frozen=True)
class Operation:
    operation_id: str
    summary: str
    tag: str
    description: str | None = None
    parameters: tuple[Param, ...] = ()
    body: type[BaseModel] | Mapping[str, Any] | None = None  # a JSON model, or raw request content
    answers: Mapping[int, Answer] = field(default_factory=dict)
    database: bool = True  # PostgreSQL down answers 503


def operation(operation_id: str, summary: str, *, tag: str, description: str | None = None,
              parameters: tuple[Param, ...] | list[Param] = (),
              body: type[BaseModel] | Mapping[str, Any] | None = None,
              answers: Mapping[int, Answer] | None = None, database: bool = True) -> Callable[[View], View]:
    """Declare what a view does, for :func:`document`; the view itself is returned unchanged."""
    declared = Operation(operation_id, summary, tag, description, tuple(parameters), body, answers or {}, database)

    def declare(view: View) -> View:
        setattr(view, VIEW_ATTRIBUTE, declared)
        return view

    return declare


# --- what the walker adds ---------------------------------------------------------------------

#: answers shared by many operations, written once under components/responses
SHARED = {
    "Unauthorized": replace(refused("No `Authorization: Bearer` header, or an unknown token.", "unauthorized"),
                            headers={"WWW-Authenticate": Header("`Bearer realm=\"attache\"`")}),
    "Forbidden": refused("The token is valid but lacks the `operator` role.", "forbidden"),
    "DatabaseUnavailable": refused("PostgreSQL is unreachable; retry after the delay.", "database_unavailable",
                                   retry_after=True),
    "TooManyReadsAtOnce": refused("The client already has `ATTACHE_MAX_READS_PER_CLIENT` reads in flight in this web "
                                  "process; ask again when one of them is done.", "too_many_reads_at_once",
                                  retry_after=True),
}
TOO_LARGE_BODY = refused(f"The request body is larger than {FORM_MAX_BYTES // (1024 * 1024)} MiB.", "too_large")

#: a rule's converter -> the type of its path parameter
CONVERTERS: dict[str, Any] = {"uuid": UUID, "int": Annotated[int, Field(ge=0)], "default": str, "string": str}
_VARIABLE = re.compile(r"<(?:(?P<converter>[a-zA-Z_][a-zA-Z0-9_]*)(?:\([^)]*\))?:)?(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)>")

INFO = {
    "title": "attache",
    "summary": "A durable photo-upload pipeline.",
    "description": "Upload photos, follow their processing, download the derivatives; operators inspect and repair "
                   "the pipeline under `/v1/ops`. Every operation but `/healthz`, `/readyz` and this document needs "
                   "`Authorization: Bearer <token>`; roles are `uploader` (its own attachments only) and `operator` "
                   "(everything, and `/v1/ops` and `/metrics`). Every error body is an `Error` object.",
    "license": {"name": "MIT", "identifier": "MIT"},
}
TAGS = [
    {"name": "attachments", "description": "Upload, status and downloads."},
    {"name": "ops", "description": "The operator API (role `operator`)."},
    {"name": "meta", "description": "Probes, metrics and this document."},
]


def openapi_path(rule: str) -> str:
    """``/v1/attachments/<uuid:attachment_id>`` -> ``/v1/attachments/{attachment_id}``."""
    return _VARIABLE.sub(lambda m: "{" + m["name"] + "}", rule)


def _path_parameters(rule: str, declared: dict[str, Param]) -> list[Param]:
    found = []
    for variable in _VARIABLE.finditer(rule):
        name, converter = variable["name"], variable["converter"] or "default"
        given = declared.pop(name, None)
        python_type = given.type if given is not None and given.type is not None else CONVERTERS[converter]
        found.append(Param(name, "path", given.description if given else None, python_type))
    if declared:
        raise ValueError(f"{rule}: path parameters {sorted(declared)} are not in the rule")
    return found


def _json_body(op: Operation) -> bool:
    """The operation reads a JSON body described by a model (not raw content)."""
    return isinstance(op.body, type) and issubclass(op.body, BaseModel)


class _Walk:
    """One pass over the documented routes: the answers first, then the schemas of every model they name."""

    def __init__(self, app: Flask):
        self.operations: list[tuple[str, str, Operation, Any]] = []
        for rule in app.url_map.iter_rules():
            declared = getattr(app.view_functions.get(rule.endpoint), VIEW_ATTRIBUTE, None)
            if declared is None:
                continue
            blueprint = app.blueprints.get(rule.endpoint.rpartition(".")[0])
            guard = protection(blueprint)
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                counted = guard is not None and reads_in_flight.counted(blueprint, rule.endpoint, method)
                self.operations.append((rule.rule, method.lower(), declared,
                                        replace(guard, reads_bounded=True) if counted else guard))
        answers = [a for _, _, op, guard in self.operations for a in self._answers(op, guard).values()
                   if isinstance(a, Answer)] + list(SHARED.values())
        wanted = {(m, "serialization") for a in answers for m in a.models}
        wanted |= {(op.body, "validation") for _, _, op, _ in self.operations if _json_body(op)}
        self.refs, definitions = models_json_schema(sorted(wanted, key=lambda pair: (pair[0].__name__, pair[1])),
                                                    ref_template="#/components/schemas/{model}",
                                                    schema_generator=_Untitled)
        self.schemas = dict(sorted(definitions.get("$defs", {}).items()))

    @staticmethod
    def _answers(op: Operation, guard) -> dict[int, Answer | str]:
        """The view's answers and those the code around it gives (by name: a shared answer)."""
        answers: dict[int, Answer | str] = dict(op.answers)
        if guard is not None:
            answers.setdefault(401, "Unauthorized")
            if guard.role is not None:
                answers.setdefault(403, "Forbidden")
            if guard.reads_bounded:  # app.web.reads_in_flight
                answers.setdefault(429, "TooManyReadsAtOnce")
        if op.database:
            answers.setdefault(503, "DatabaseUnavailable")
        if _json_body(op):
            answers.setdefault(413, TOO_LARGE_BODY)
        return dict(sorted(answers.items()))

    def ref(self, model: type[BaseModel], mode: str = "serialization") -> dict:
        return self.refs[(model, mode)]

    def answer(self, answer: Answer) -> dict:
        out: dict[str, Any] = {"description": answer.description}
        if answer.headers:
            out["headers"] = {name: h.document() for name, h in answer.headers.items()}
        if answer.content is not None:
            out["content"] = dict(answer.content)
        elif answer.codes:
            codes = {"const": answer.codes[0]} if len(answer.codes) == 1 else {"enum": list(answer.codes)}
            out["content"] = {JSON: {"schema": {"allOf": [self.ref(Error), {"properties": {"error": codes}}]}}}
        elif answer.models:
            refs = [self.ref(m) for m in answer.models]
            out["content"] = {JSON: {"schema": refs[0] if len(refs) == 1 else {"oneOf": refs}}}
        return out

    def operation(self, rule: str, op: Operation, guard) -> dict:
        out: dict[str, Any] = {"operationId": op.operation_id, "tags": [op.tag], "summary": op.summary}
        if op.description:
            out["description"] = op.description
        out["security"] = BEARER if guard is not None else []
        given = {p.name: p for p in op.parameters if p.where == "path"}
        parameters = _path_parameters(rule, given) + [p for p in op.parameters if p.where != "path"]
        if parameters:
            out["parameters"] = [p.document() for p in parameters]
        if _json_body(op):  # a body whose every field has a default may be left out
            required = any(f.is_required() for f in op.body.model_fields.values())
            out["requestBody"] = {"required": required,
                                  "content": {JSON: {"schema": self.ref(op.body, "validation")}}}
        elif op.body is not None:
            out["requestBody"] = {"required": True, "content": dict(op.body)}
        out["responses"] = {str(status): {"$ref": f"#/components/responses/{a}"} if isinstance(a, str)
                            else self.answer(a) for status, a in self._answers(op, guard).items()}
        return out


def document(app: Flask) -> dict:
    """The OpenAPI 3.1.0 document of ``app``'s API routes (a fresh dict on every call)."""
    walk = _Walk(app)
    paths: dict[str, dict] = {}
    for rule, method, op, guard in sorted(walk.operations, key=lambda o: (o[0], o[1])):
        paths.setdefault(openapi_path(rule), {})[method] = walk.operation(rule, op, guard)
    # tus is a protocol of headers with no JSON shape of its own: its paths are written by
    # app/web/tus_openapi.py from the constants of app/web/tus.py, and refer to the shared components by name
    from app.web import (
        tus_openapi,  # it reads app/web/tus.py, which imports this module
    )

    paths.update(tus_openapi.paths())
    paths = dict(sorted(paths.items()))
    return {
        "openapi": "3.1.0",
        "info": {**INFO, "version": _version()},
        "tags": TAGS[:1] + [tus_openapi.TAG] + TAGS[1:],
        "security": BEARER,
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A token from `ATTACHE_API_TOKENS`."}},
            "schemas": walk.schemas,
            "responses": {name: walk.answer(answer) for name, answer in SHARED.items()},
        },
    }


def _version() -> str:
    try:
        return metadata.version("attache")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout without install
        return "0.0.0"
