"""Phone photos end to end: a HEIC and an AVIF uploaded to real web and worker processes.

Each is the Display P3 test card of ``tests/phone_images.py``, stored turned
a quarter and tagged with a P3 profile. Through ``POST /v1/attachments`` it
must reach ``ready``, its original come back byte for byte under its own
type and extension, and every derivative the default pipeline (version 2) makes come
out upright, in sRGB (the quadrants' colours, in their corners).
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.corpus import DATA
from tests.processes import Deployment
from tests.test_imaging import assert_upright_srgb_card

pytestmark = pytest.mark.processes

CARDS = {
    "phones/card_p3_orientation6.heic": ("image/heic", "heic", (600, 400)),
    "phones/card_p3_orientation6.avif": ("image/avif", "avif", (400, 600)),  # AVIF reports its stored size
}


def test_heic_and_avif_uploads_reach_ready_upright_in_srgb(env, tmp_path):
    deployment = Deployment({**env, "ATTACHE_PIPELINE_VERSION": "2"}, tmp_path)  # the default outside tests
    deployment.start("web")
    deployment.start("worker")
    try:
        accepted = {}
        for relative in CARDS:
            response = deployment.upload(DATA / relative)
            assert response.status_code == 202, response.text
            accepted[relative] = response.json()["id"]
        for relative, attachment_id in accepted.items():
            content_type, extension, size = CARDS[relative]
            final = deployment.wait_state(attachment_id, timeout=120)
            assert (final["state"], final["error_code"]) == ("ready", None), (relative, final)
            assert (final["content_type"], final["width"], final["height"]) == (content_type, *size)
            assert set(final["variants"]) == {"original", "thumbnail", "crop", "optimized", "webp"}

            original = deployment.session.get(deployment.url + final["variants"]["original"]["url"], timeout=30)
            assert original.status_code == 200
            assert original.content == (DATA / relative).read_bytes()
            assert original.headers["Content-Type"].startswith(content_type)
            assert f'filename="card_p3_orientation6.{extension}"' in original.headers["Content-Disposition"]

            for name in ("thumbnail", "crop", "optimized", "webp"):
                response = deployment.session.get(deployment.url + final["variants"][name]["url"], timeout=30)
                assert response.status_code == 200, (name, response.text)
                image = Image.open(io.BytesIO(response.content))
                if name == "crop":
                    assert image.size == (512, 512)
                else:  # upright: landscape, 3:2
                    assert image.width > image.height and abs(image.width * 2 - image.height * 3) <= 3, image.size
                assert "icc_profile" not in image.info, "pixels are sRGB, no profile is carried"
                assert_upright_srgb_card(image)
    finally:
        deployment.stop_all()
