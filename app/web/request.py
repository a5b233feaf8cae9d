"""A Flask request class whose uploaded file parts stream into a :class:`HashingSpool`."""

from __future__ import annotations

from flask import Request, current_app

from app.uploads import HashingSpool


class UploadRequest(Request):
    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        settings = current_app.extensions["attache"].settings
        spool = HashingSpool(settings.max_upload_bytes)
        self.__dict__.setdefault("attache_spools", []).append(spool)
        return spool

    def discard_spools(self, keep: HashingSpool | None = None) -> None:
        for spool in self.__dict__.get("attache_spools", []):
            if spool is not keep:
                spool.discard()
