"""The OpenAPI paths of ``/v1/uploads`` (resumable uploads, :mod:`app.web.tus`), merged into the API document.

Self-contained: it refers to the document's shared components by name only
(``Error``, the ``Unauthorized`` response), so whatever builds the document
adds :func:`paths` to its own.
"""

from __future__ import annotations

from typing import Any

from app.web.tus import (
    ATTACHMENT_ID,
    CHECKSUM_ALGORITHMS,
    EXTENSIONS,
    PART_TYPE,
    TUS_VERSION,
)

TAG = {"name": "uploads", "description": "Resumable uploads over tus 1.0 (https://tus.io): a photo sent in "
                                         "pieces, resumed after a dropped connection, ends as an attachment."}
BEARER = [{"bearer": []}]
ERROR = {"$ref": "#/components/schemas/Error"}
UNAUTHORIZED = {"401": {"$ref": "#/components/responses/Unauthorized"}}


def _header(description: str, schema: dict | None = None, *, required: bool = False) -> dict:
    header: dict[str, Any] = {"description": description, "schema": schema or {"type": "string"}}
    if required:
        header["required"] = True
    return header


def _parameter(name: str, description: str, schema: dict | None = None, *, required: bool = False) -> dict:
    return {"name": name, "in": "header", "required": required, "description": description,
            "schema": schema or {"type": "string"}}


TUS_RESUMABLE = _parameter("Tus-Resumable", "The protocol version; anything else is refused with 412.",
                           {"type": "string", "const": TUS_VERSION}, required=True)
UPLOAD_ID = {"name": "upload_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"},
             "description": "From the `Location` of the creation."}
ANSWER_HEADERS = {
    "Tus-Resumable": _header(f"`{TUS_VERSION}`", {"type": "string", "const": TUS_VERSION}, required=True),
    "Upload-Expires": _header("When the upload expires (RFC 9110 date); every PATCH moves it "
                              "`ATTACHE_UPLOAD_EXPIRY_SECONDS` later.", required=True),
    ATTACHMENT_ID: _header("Once the last byte has arrived: the attachment it made "
                           "(`/v1/attachments/{id}`).", {"type": "string", "format": "uuid"}),
}
OFFSET = _header("How many bytes the upload has.", {"type": "string", "pattern": "^[0-9]+$"}, required=True)
PART_BODY = {"required": False, "content": {PART_TYPE: {"schema": {"type": "string", "format": "binary"}}}}
CHECKSUM = _parameter("Upload-Checksum", f"`<algorithm> <base64 digest>` of this body ({', '.join(CHECKSUM_ALGORITHMS)}"
                                         "); a mismatch keeps nothing of it (460).")


def _error(description: str, codes: list[str], headers: dict | None = None, *, body: bool = True) -> dict:
    response: dict[str, Any] = {"description": description.rstrip(".") + " (`error`: "
                                + ", ".join(f"`{c}`" for c in codes) + ")."}
    if body:  # a HEAD answer has none
        response["content"] = {"application/json": {"schema": {
            "allOf": [ERROR, {"properties": {"error": {"enum": codes}}}]}}}
    if headers:
        response["headers"] = headers
    return response


RETRY_AFTER = {"Retry-After": _header("Seconds to wait before retrying.", {"type": "string", "pattern": "^[0-9]+$"})}
VERSION = {"412": _error("No `Tus-Resumable: 1.0.0`.", ["tus_version"],
                         {"Tus-Version": _header(f"`{TUS_VERSION}`", required=True)})}
UNAVAILABLE = {"503": _error("PostgreSQL or storage is down, or the web's temporary directory is full; retry later.",
                             ["database_unavailable", "storage_unavailable", "spool_unavailable"], RETRY_AFTER)}
GONE = {"404": _error("No such upload, or not yours, or terminated, or forgotten after it expired.", ["not_found"]),
        "410": _error("The upload expired (`upload_expired`), or its partial bytes were lost (`upload_lost`); "
                      "start a new one.", ["upload_expired", "upload_lost"])}
LOCKED = {"423": _error("Another request is writing this upload right now (a PATCH still being handled, or a "
                        "DELETE); retry in a moment.", ["upload_locked"])}
#: a request that sends bytes refused for its headers or its body's end
BAD_SENDING = ("A malformed header, or the body ended early (`incomplete_body`; without a checksum the bytes that "
               "arrived are kept: HEAD says where to resume).")
BAD_SENDING_CODES = ["bad_upload_length", "bad_upload_offset", "bad_metadata", "unsupported_checksum", "bad_checksum",
                     "bad_digest_header", "unsupported_digest", "incomplete_body", "http_error"]
#: what sending bytes can be answered with, the last byte's handoff included
SENDING = {
    "400": _error(BAD_SENDING, BAD_SENDING_CODES),
    "413": _error("Past `Upload-Length` or the upload limit, or (at the last byte) the image declares too many "
                  "pixels, too long a side, or would need more memory to render than the decode budget.",
                  ["too_large", "decompression_bomb", "image_too_large"]),
    "415": _error(f"A body that is not `{PART_TYPE}`; a first part whose first 64 bytes claim no image format "
                  "attache accepts; or (at the last byte) not an image attache processes or a corrupt header. "
                  "Refused bytes terminate the upload. A body in a content coding (`Content-Encoding`) is refused "
                  "before it is read, the upload kept.",
                  ["bad_content_type", "unsupported_format", "corrupt_image", "unsupported_content_encoding"]),
    "422": _error("At the last byte: the joined bytes do not match the creation's `Repr-Digest` "
                  "(`digest_mismatch`; the upload is terminated), or a retried handoff found other bytes under the "
                  "upload's key.", ["digest_mismatch", "idempotency_key_reused"]),
    "460": _error("The body does not match its `Upload-Checksum`; nothing of it was kept.", ["checksum_mismatch"]),
    "429": _error("The uploader already has `ATTACHE_MAX_PENDING_PER_UPLOADER` uploads accepted and not yet ready or "
                  "failed: a creation makes no upload; at the last byte the upload stays at the offset before that "
                  "PATCH, whose retry (the same bytes) hands it off. Retry once some are ready. A creation is also "
                  "refused while the uploader's unfinished uploads number `ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER` "
                  "or would declare more than `ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER` with it "
                  "(`too_many_open_uploads`): finish or terminate some, or wait for them to expire. A body (a "
                  "PATCH's, a creation's) is refused before it is read while the uploader is already sending "
                  "`ATTACHE_MAX_BODIES_PER_UPLOADER` bodies to this web process (`too_many_uploads_at_once`).",
                  ["too_many_pending", "too_many_open_uploads", "too_many_uploads_at_once"], RETRY_AFTER),
}


def paths() -> dict:
    return {
        "/v1/uploads": {
            "options": {
                "operationId": "tusDiscovery", "tags": ["uploads"], "security": [],
                "summary": "What this tus server speaks (no token needed)",
                "responses": {"204": {"description": "The server's tus configuration.", "headers": {
                    "Tus-Version": _header(f"`{TUS_VERSION}`", required=True),
                    "Tus-Extension": _header(f"`{','.join(EXTENSIONS)}`", required=True),
                    "Tus-Max-Size": _header("The upload limit, bytes (`ATTACHE_MAX_UPLOAD_BYTES`).",
                                            {"type": "string", "pattern": "^[0-9]+$"}, required=True),
                    "Tus-Checksum-Algorithm": _header(f"`{','.join(CHECKSUM_ALGORITHMS)}`", required=True),
                }}},
            },
            "post": {
                "operationId": "createUpload", "tags": ["uploads"], "security": BEARER,
                "summary": "Create a resumable upload (tus creation, creation-with-upload)",
                "description": "`Upload-Length` is checked against the upload limit before any byte is sent. A "
                               "body is the first PATCH; if it is all of the bytes, the upload ends at once.",
                "parameters": [
                    TUS_RESUMABLE,
                    _parameter("Upload-Length", "The size of the whole file, bytes.", {"type": "integer", "minimum": 1},
                               required=True),
                    _parameter("Upload-Metadata", "tus metadata: comma-separated `key base64(value)`; `filename` "
                                                  "(or `name`) is the display name, sanitized. Echoed on HEAD."),
                    _parameter("Repr-Digest", "RFC 9530, e.g. `sha-256=:<base64>:`: the whole file's digest. The "
                                              "last byte's handoff compares the joined bytes with it and refuses a "
                                              "mismatch (`422 digest_mismatch`, the upload terminated); `sha-256` "
                                              "is the algorithm checked, another alone is `400 unsupported_digest`."),
                    CHECKSUM,
                    _parameter("Idempotency-Key", "1-255 printable ASCII characters but the comma, the quote and "
                                                  "the backslash, sent once (else `400 bad_idempotency_key`). While "
                                                  "an upload this uploader created with the key is there (open, or "
                                                  "finished), the creation answers that upload, "
                                                  "`Idempotent-Replayed: true`, and its body is not read; one of "
                                                  "another `Upload-Length`, `Repr-Digest` or `Upload-Metadata` is "
                                                  "`422 idempotency_key_reused`. An expired or terminated upload "
                                                  "gives its key up. The upload page sends one a file."),
                ],
                "requestBody": PART_BODY,
                "responses": {
                    "201": {"description": "Created (or, with `Idempotent-Replayed`, made before by a creation "
                                           "with the same Idempotency-Key).", "headers": {
                        "Location": _header("The upload's URL, `/v1/uploads/{id}`.", required=True),
                        "Idempotent-Replayed": _header("`true` when an earlier creation with the same "
                                                       "Idempotency-Key made the upload: `Upload-Offset` says where "
                                                       "it stands."),
                        "Upload-Offset": _header("With a body, or replayed: how many bytes the upload has.",
                                                 {"type": "string", "pattern": "^[0-9]+$"}),
                        **ANSWER_HEADERS}},
                    **SENDING,
                    "400": {**_error(BAD_SENDING, [*BAD_SENDING_CODES, "bad_idempotency_key"]), "headers": {
                        "Location": _header("With `incomplete_body`: the upload was made, and keeps the bytes that "
                                            "arrived (without a checksum); resume it here."),
                        "Upload-Offset": _header("With `incomplete_body`: where to resume.",
                                                 {"type": "string", "pattern": "^[0-9]+$"})}},
                    **UNAUTHORIZED, **VERSION,
                    "503": {**UNAVAILABLE["503"], "headers": {
                        **UNAVAILABLE["503"]["headers"],
                        "Location": _header("With `database_unavailable` and a body: the upload was made and is kept "
                                            "(its body's outcome may be unknown); HEAD here says where it stands and "
                                            "what it made.")}},
                },
            },
        },
        "/v1/uploads/{upload_id}": {
            "head": {
                "operationId": "getUploadOffset", "tags": ["uploads"], "security": BEARER,
                "summary": "Where to resume (tus core)",
                "parameters": [UPLOAD_ID, TUS_RESUMABLE],
                "responses": {
                    "200": {"description": "The upload's state.", "headers": {
                        "Upload-Offset": OFFSET,
                        "Upload-Length": _header("The size of the whole file.", {"type": "string",
                                                                                  "pattern": "^[0-9]+$"},
                                                 required=True),
                        "Upload-Metadata": _header("As sent at creation."),
                        "Cache-Control": _header("`no-store`", required=True),
                        **ANSWER_HEADERS}},
                    "401": {"description": "No or an unknown token."},
                    "404": _error("No such upload, or not yours.", ["not_found"], body=False),
                    "410": _error("The upload expired.", ["upload_expired"], body=False),
                    "412": _error("No `Tus-Resumable: 1.0.0`.", ["tus_version"], body=False),
                    "503": _error("PostgreSQL is down.", ["database_unavailable"], body=False),
                },
            },
            "patch": {
                "operationId": "appendToUpload", "tags": ["uploads"], "security": BEARER,
                "summary": "Send the next bytes (tus core, checksum)",
                "description": "The body is appended at `Upload-Offset`, which must be the upload's offset (two "
                               "PATCHes at one offset: one appends, the other gets 423 while the first is being "
                               "handled, 409 after). At the last byte the "
                               "upload goes through the durable handoff of `POST /v1/attachments` and the answer "
                               f"carries `{ATTACHMENT_ID}`.",
                "parameters": [
                    UPLOAD_ID, TUS_RESUMABLE,
                    _parameter("Upload-Offset", "Where these bytes start.", {"type": "integer", "minimum": 0},
                               required=True),
                    CHECKSUM,
                ],
                "requestBody": {**PART_BODY, "required": True},
                "responses": {
                    "204": {"description": "Appended.", "headers": {"Upload-Offset": OFFSET, **ANSWER_HEADERS}},
                    "409": _error("`Upload-Offset` is not the upload's: HEAD and resume from there.",
                                  ["offset_mismatch"]),
                    **SENDING, **GONE, **LOCKED, **UNAUTHORIZED, **VERSION, **UNAVAILABLE,
                },
            },
            "delete": {
                "operationId": "terminateUpload", "tags": ["uploads"], "security": BEARER,
                "summary": "Terminate the upload and remove its partial bytes (an attachment it made stays)",
                "parameters": [UPLOAD_ID, TUS_RESUMABLE],
                "responses": {
                    "204": {"description": "Terminated.", "headers": {"Tus-Resumable": ANSWER_HEADERS["Tus-Resumable"]}},
                    "404": GONE["404"], **LOCKED, **UNAUTHORIZED, **VERSION, **UNAVAILABLE,
                },
            },
        },
    }
