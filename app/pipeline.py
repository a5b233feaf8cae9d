"""Pipeline versions: which variants a job must publish before it is ``ready``.

``original`` is the uploaded bytes, copied unchanged from staging to a
content-addressed key; every other variant is rendered by
:func:`app.imaging.render` from its :class:`~app.imaging.VariantSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.imaging import PIPELINE_V1_SPECS, VariantSpec

ORIGINAL = "original"


@dataclass(frozen=True)
class PipelineVersion:
    version: int
    specs: dict[str, VariantSpec]

    @property
    def variants(self) -> tuple[str, ...]:
        return (ORIGINAL, *self.specs)


REGISTRY: dict[int, PipelineVersion] = {
    1: PipelineVersion(1, dict(PIPELINE_V1_SPECS)),
}


def get(version: int) -> PipelineVersion:
    try:
        return REGISTRY[version]
    except KeyError:
        raise LookupError(f"pipeline version {version} is not registered") from None


def original_key(attachment_id, sha256: str) -> str:
    return f"attachments/{attachment_id}/original/{sha256}"


def variant_key(attachment_id, version: int, variant: str, sha256: str, extension: str) -> str:
    """Content-addressed: a key can never be overwritten with different bytes."""
    return f"attachments/{attachment_id}/v{version}/{variant}-{sha256[:32]}.{extension}"


def staging_key(attachment_id) -> str:
    return f"staging/{attachment_id}"
