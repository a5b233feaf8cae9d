"""A Flask request class whose uploaded file parts stream into a :class:`HashingSpool`.

Its body is read through a :class:`~app.web.body.BodyStream`, so a body cut
short is noticed (:meth:`UploadRequest.body_incomplete`).
"""

from __future__ import annotations

from flask import Request, current_app
from werkzeug.utils import cached_property
from werkzeug.wsgi import get_input_stream

from app.uploads import HashingSpool
from app.web.body import BodyStream


class UploadRequest(Request):
    @cached_property
    def stream(self) -> BodyStream:
        return BodyStream(get_input_stream(self.environ, max_content_length=self.max_content_length),
                          self.content_length)

    def body_incomplete(self) -> bool:
        """The body was read to its end, and that end came before the declared length."""
        stream = self.__dict__.get("stream")
        return isinstance(stream, BodyStream) and stream.incomplete

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        settings = current_app.extensions["attache"].settings
        spool = HashingSpool(settings.max_upload_bytes)
        self.__dict__.setdefault("attache_spools", []).append(spool)
        return spool

    def discard_spools(self, keep: HashingSpool | None = None) -> None:
        for spool in self.__dict__.get("attache_spools", []):
            if spool is not keep:
                spool.discard()
