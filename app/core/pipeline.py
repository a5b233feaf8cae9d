"""Pipeline versions: which variants a job must publish before it is ``ready``.

Versions are declared here, in code. A version's definition is immutable
once jobs exist for it: its fingerprint (a hash of every variant's
definition and the encoder settings) is recorded in ``pipeline_versions``
the first time a job is created for it, and creating a job refuses a
version whose fingerprint changed (:class:`PipelineChanged`). A test pins
the fingerprints too, so an edit in place fails CI before it ships.
To change the pipeline, register a new version.

``original`` is the uploaded bytes, copied unchanged to a content-addressed
key shared by every version; every other variant is rendered by
:func:`app.adapters.imaging.render` from its :class:`~app.adapters.imaging.VariantSpec`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from app.adapters.imaging import PIPELINE_V1_SPECS, VariantSpec
from app.adapters.imaging.render import (
    AVIF_QUALITY,
    AVIF_SPEED,
    AVIF_THREADS,
    JPEG_QUALITY,
    WEBP_METHOD,
    WEBP_QUALITY,
)
from app.errors import PipelineChanged

ORIGINAL = "original"


@dataclass(frozen=True)
class PipelineVersion:
    version: int
    specs: dict[str, VariantSpec]

    @property
    def variants(self) -> tuple[str, ...]:
        return (ORIGINAL, *self.specs)

    def costliest_first(self, names) -> list[str]:
        """``names`` in the order their renders should start: the longest first, the ``original`` copy last.

        The cost is estimated from the spec alone: the output's largest pixel
        count, three times that for WebP and AVIF (their encoders are the
        slowest part of a render). A job's renders run side by side on the
        worker's threads; starting the longest first keeps it off the end of
        the critical path. The order changes no output.
        """
        def cost(name: str) -> int:
            if name == ORIGINAL:
                return 0
            spec = self.specs[name]
            return spec.width * spec.height * (3 if spec.output in ("webp", "avif") else 1)

        return sorted(names, key=cost, reverse=True)

    @property
    def fingerprint(self) -> str:
        encoders = {"jpeg_quality": JPEG_QUALITY, "webp_quality": WEBP_QUALITY, "webp_method": WEBP_METHOD}
        if any(spec.output == "avif" for spec in self.specs.values()):
            # only versions that render AVIF carry its settings, so adding the
            # choice left every earlier version's fingerprint as it was
            encoders |= {"avif_quality": AVIF_QUALITY, "avif_speed": AVIF_SPEED, "avif_threads": AVIF_THREADS}
        definition = {
            "version": self.version,
            "variants": [asdict(spec) for spec in self.specs.values()],
            "encoders": encoders,
        }
        return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


REGISTRY: dict[int, PipelineVersion] = {
    # v1: the main track (contract level 4)
    1: PipelineVersion(1, dict(PIPELINE_V1_SPECS)),
    # v2: a larger thumbnail for high-density screens, and a WebP rendition
    2: PipelineVersion(2, {
        "thumbnail": VariantSpec("thumbnail", "fit", 512, 512),
        "crop": VariantSpec("crop", "cover", 512, 512),
        "optimized": VariantSpec("optimized", "bounded", 2048, 2048),
        "webp": VariantSpec("webp", "bounded", 2048, 2048, output="webp"),
    }),
}

NEWEST = max(REGISTRY)


def get(version: int) -> PipelineVersion:
    try:
        return REGISTRY[version]
    except KeyError:
        raise LookupError(f"pipeline version {version} is not registered") from None


#: (database, version, fingerprint) found already recorded by an earlier, committed transaction: a recorded
#: fingerprint never changes, so each process checks a version once per database, not on every upload
_recorded: set[tuple[object, int, str]] = set()


def ensure_recorded(conn: Connection, version: int) -> None:
    """Record the version's fingerprint on first use; refuse a version edited in place."""
    from app.adapters.postgres.models import pipeline_versions

    definition = get(version)
    key = (conn.engine.url, version, definition.fingerprint)
    if key in _recorded:
        return
    inserted = conn.execute(pg_insert(pipeline_versions).values(version=version, fingerprint=definition.fingerprint)
                            .on_conflict_do_nothing(index_elements=["version"])
                            .returning(pipeline_versions.c.version)).first() is not None
    recorded = conn.execute(select(pipeline_versions.c.fingerprint)
                            .where(pipeline_versions.c.version == version)).scalar_one()
    if recorded != definition.fingerprint:
        raise PipelineChanged(f"pipeline version {version} differs from the definition its jobs were made with; "
                              "register a new version instead of editing it")
    if not inserted:  # committed before this transaction (ours may yet roll back)
        _recorded.add(key)


def original_key(attachment_id, sha256: str) -> str:
    return f"attachments/{attachment_id}/original/{sha256}"


def variant_key(attachment_id, version: int, variant: str, sha256: str, extension: str) -> str:
    """Content-addressed: a key can never be overwritten with different bytes."""
    return f"attachments/{attachment_id}/v{version}/{variant}-{sha256[:32]}.{extension}"


def staging_key(attachment_id) -> str:
    return f"staging/{attachment_id}"
