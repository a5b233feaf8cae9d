"""The provenance record of a variant: what made it, stored on its row and never changed once published.

Written by the render step with the variant row (``variants.provenance``);
a trigger (migration 0013) refuses any UPDATE of it once the variant is
published. It names:

* ``source``: the original's sha256, content type and size;
* ``pipeline``: the version and its fingerprint (:attr:`~app.core.pipeline.PipelineVersion.fingerprint`);
* ``spec``: the variant's definition (kind, box, output);
* ``renderer`` and ``libraries``: Pillow and its codecs' versions (libjpeg, libwebp, ...);
* ``encoder``: the encoder and the settings it was called with;
* ``stripped``: the metadata of the source no derivative keeps (EXIF tags,
  GPS yes/no, XMP, comment, ICC profile and whether it was converted to sRGB).

``original`` is the uploaded bytes, unchanged: its record names the source
and the pipeline, and ``copy`` instead of a renderer.
"""

from __future__ import annotations

from dataclasses import asdict

from app.adapters import imaging


def _source(attachment) -> dict:
    return {"sha256": attachment.sha256, "content_type": attachment.content_type, "size": attachment.size}


def _pipeline(version) -> dict:
    return {"version": version.version, "fingerprint": version.fingerprint}


def of_original(attachment, version) -> dict:
    return {"source": _source(attachment), "pipeline": _pipeline(version), "spec": None,
            "copy": "the uploaded bytes, unchanged", "renderer": None, "libraries": None, "encoder": None,
            "stripped": None}


def of_render(attachment, version, variant: str, rendered, stripped: dict) -> dict:
    return {"source": _source(attachment), "pipeline": _pipeline(version),
            "spec": asdict(version.specs[variant]), "copy": None, **imaging.libraries(),
            "encoder": rendered.encoder, "stripped": stripped}
