"""Resampled images shared between the renders of one process (app/adapters/imaging/shared.py)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import pytest
from PIL import Image

from app.adapters.imaging import Limits, budget, render
from app.adapters.imaging.shared import SHARED, SharedImages
from app.core import pipeline
from app.errors import CorruptImage
from tests.test_imaging import LoadSpy, path_of

LIMITS = Limits()
V2 = pipeline.get(2).specs


def _wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_v2_optimized_and_webp_decode_the_original_once(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    path = path_of("photos/rocket_12mp_4241x2830.jpg")
    jpeg, webp = render(path, V2["optimized"], LIMITS), render(path, V2["webp"], LIMITS)
    assert len(spy.calls) == 1
    assert (jpeg.content_type, webp.content_type) == ("image/jpeg", "image/webp")
    assert (jpeg.width, jpeg.height) == (webp.width, webp.height) == (2048, 1367)
    render(path, V2["thumbnail"], LIMITS)  # another geometry: decoded again
    assert len(spy.calls) == 2


def test_a_shared_render_is_the_same_as_a_fresh_one() -> None:
    path = path_of("synthetic/exif_gps_orientation6.jpg")
    shared = [render(path, V2["optimized"], LIMITS) for _ in range(2)][1]
    SHARED.clear()
    assert render(path, V2["optimized"], LIMITS) == shared


def test_the_same_pixels_under_another_name_are_shared_and_other_pixels_are_not(tmp_path, monkeypatch) -> None:
    original = path_of("photos/coffee.jpg")
    copy = tmp_path / "copy.jpg"
    copy.write_bytes(original.read_bytes())
    other = tmp_path / "other.jpg"
    with Image.open(original) as img:
        img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(other, quality=90)
    spy = LoadSpy(monkeypatch)
    first, again = render(original, V2["crop"], LIMITS), render(copy, V2["crop"], LIMITS)
    assert first == again and len(spy.calls) == 1  # an S3 download is a new path to the same bytes
    assert render(other, V2["crop"], LIMITS) != first and len(spy.calls) == 2


def test_the_digest_the_worker_knows_keys_the_pixels_and_the_file_is_not_hashed(monkeypatch) -> None:
    """The worker passes the attachment's SHA-256 (taken at upload): the file is not read to hash it again."""
    renderer = sys.modules["app.adapters.imaging.render"]
    hashed = []
    content_key = renderer.content_key
    monkeypatch.setattr(renderer, "content_key", lambda path: hashed.append(path) or content_key(path))
    spy = LoadSpy(monkeypatch)
    path = path_of("photos/rocket_12mp_4241x2830.jpg")
    digest = content_key(path)
    jpeg = render(path, V2["optimized"], LIMITS, sha256=digest)
    render(path, V2["webp"], LIMITS, sha256=digest)
    assert hashed == [] and len(spy.calls) == 1
    assert render(path, V2["optimized"], LIMITS) == jpeg and len(spy.calls) == 1  # hashed: the same key
    assert hashed == [path]


def test_concurrent_renders_of_one_geometry_decode_once(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    path = path_of("photos/chelsea_12mp_4247x2825.jpg")
    results = []
    threads = [threading.Thread(target=lambda spec=spec: results.append(render(path, spec, LIMITS)))
               for spec in (V2["optimized"], V2["webp"], V2["optimized"], V2["webp"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(spy.calls) == 1
    assert len({r.data for r in results}) == 2


def test_a_failed_make_is_not_kept_and_the_waiters_try_themselves() -> None:
    shared = SharedImages()
    started, release = threading.Event(), threading.Event()
    errors = []

    def failing():
        started.set()
        release.wait(5)
        raise CorruptImage("image data cannot be decoded")

    def call(make):
        try:
            shared.get_or_make("key", make)
        except CorruptImage as exc:
            errors.append(exc)

    first = threading.Thread(target=call, args=(failing,))
    first.start()
    started.wait(5)
    made = []
    second = threading.Thread(target=lambda: made.append(shared.get_or_make("key", lambda: Image.new("L", (4, 4)))))
    second.start()
    assert not made  # whether it is waiting yet or not, it cannot finish while the first one makes the image
    release.set()
    first.join(5)
    second.join(5)
    assert len(errors) == 1 and made[0].size == (4, 4)
    assert shared.get_or_make("key", lambda: pytest.fail("kept: not made again")).size == (4, 4)


def test_the_kept_images_stay_under_their_capacity() -> None:
    shared = SharedImages(capacity_bytes=3 * 100 * 100 * 4)
    for n in range(5):
        shared.get_or_make(n, lambda: Image.new("RGB", (100, 100)))
    assert list(shared._entries) == [2, 3, 4]
    shared.get_or_make("large", lambda: Image.new("RGB", (1000, 1000)))  # larger than all: not kept
    assert "large" not in shared._entries and list(shared._entries) == [2, 3, 4]
    assert shared.get_or_make(2, lambda: pytest.fail("evicted too early")).size == (100, 100)
    shared.get_or_make(5, lambda: Image.new("RGB", (100, 100)))
    assert list(shared._entries) == [4, 2, 5]  # least recently used went first


def test_a_waiting_render_gets_the_image_made_for_it_even_when_the_lru_did_not_keep_it() -> None:
    """With several jobs at once, other renders' images pushed a made image out before its waiter woke: made twice."""
    shared = SharedImages(capacity_bytes=0)  # keeps nothing, as if pushed out at once
    started, release = threading.Event(), threading.Event()
    makes = []

    def slow():
        makes.append("first")
        started.set()
        release.wait(5)
        return Image.new("L", (4, 4))

    got = []
    first = threading.Thread(target=lambda: got.append(shared.get_or_make("key", slow)))
    first.start()
    started.wait(5)
    second = threading.Thread(target=lambda: got.append(shared.get_or_make("key", lambda: makes.append("again"))))
    second.start()
    _wait_until(lambda: shared._making["key"].waiters == 1)
    release.set()
    first.join(5)
    second.join(5)
    assert makes == ["first"] and len(got) == 2 and got[0] is got[1]
    assert "key" not in shared._entries


def test_a_render_of_pixels_already_made_reserves_only_its_encoding(monkeypatch) -> None:
    """v2's webp made the 2048 px pixels; optimized, which shares them, need not wait for a whole decode's budget."""
    path = path_of("photos/rocket_12mp_4241x2830.jpg")
    spec = V2["optimized"]
    with Image.open(path) as img, open(path, "rb") as fp:
        price = budget.estimate(img, "JPEG", fp, spec)
    assert price.output < price.total
    limits = Limits(max_decode_bytes=price.total + price.output)
    SHARED.clear()
    render(path, V2["webp"], limits)  # the pixels are made and kept
    spy = LoadSpy(monkeypatch)
    held, release = threading.Event(), threading.Event()

    def hold_the_budget():
        with budget.RESERVATIONS.scope(limits.max_decode_bytes) as reserve:
            reserve(price.total)  # another render's decode: what is left is an encoding's price
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_budget)
    budget.RESERVATIONS.peak = 0
    holder.start()
    try:
        held.wait(5)
        results = []
        encoder = threading.Thread(target=lambda: results.append(render(path, spec, limits)))
        encoder.start()
        encoder.join(30)
        assert results and results[0].width == 2048, "waited for a decode's budget it does not need"
    finally:
        release.set()
        holder.join(5)
    assert spy.calls == [] and budget.RESERVATIONS.in_use == 0
    assert budget.RESERVATIONS.peak == price.total + price.output  # the encoding was priced, and only it


def _rocket_and_the_price_of_its_optimized() -> tuple:
    path = path_of("photos/rocket_12mp_4241x2830.jpg")
    with Image.open(path) as img, open(path, "rb") as fp:
        return path, budget.estimate(img, "JPEG", fp, V2["optimized"])


def _second_while_the_first_makes(threads: list[threading.Thread], making: threading.Event, timeout: float) -> bool:
    """Start the first thread, the second once the first makes the pixels; whether both ended within *timeout*."""
    threads[0].start()
    assert making.wait(5)
    threads[1].start()
    for thread in threads:
        thread.join(timeout)
    return not any(thread.is_alive() for thread in threads)


def test_a_render_whose_shared_pixels_failed_to_come_makes_them_at_the_full_price(monkeypatch) -> None:
    """It waited to share pixels being made; their make failed, so it makes them itself at the whole price (the
    budget is one render's price: holding any part of it while waiting for the rest would wait for ever)."""
    renderer = sys.modules["app.adapters.imaging.render"]
    path, price = _rocket_and_the_price_of_its_optimized()
    limits = Limits(max_decode_bytes=price.total)
    SHARED.clear()
    upright, making = renderer._upright, threading.Event()

    def fails_once_the_other_waits(img, family, spec):
        if threading.current_thread().name != "first":
            return upright(img, family, spec)
        making.set()
        _wait_until(lambda: any(flight.waiters for flight in SHARED._making.values()))  # the other waits for them
        raise CorruptImage("image data cannot be decoded")

    monkeypatch.setattr(renderer, "_upright", fails_once_the_other_waits)
    errors, results = [], []

    def first():
        try:
            render(path, V2["optimized"], limits)
        except CorruptImage as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first, name="first"),
               threading.Thread(target=lambda: results.append(render(path, V2["optimized"], limits)), name="second")]
    assert _second_while_the_first_makes(threads, making, 30), "waited for ever for the budget it held part of"
    assert len(errors) == 1 and results[0].width == 2048
    assert budget.RESERVATIONS.in_use == 0


@contextlib.contextmanager
def _second_render_while_the_first_makes(monkeypatch, path, limits: Limits):
    """Two renders of v2's optimized of *path* (one key): the second starts while the first makes the pixels, which
    it does only once the block ends. Yields the specs made and the results (complete after the block)."""
    renderer = sys.modules["app.adapters.imaging.render"]
    upright, makes, release = renderer._upright, [], threading.Event()

    def held_back(img, family, spec):
        makes.append(spec.name)
        release.wait(30)
        return upright(img, family, spec)

    monkeypatch.setattr(renderer, "_upright", held_back)
    results = []
    threads = [threading.Thread(target=lambda: results.append(render(path, V2["optimized"], limits)))
               for _ in range(2)]
    threads[0].start()
    try:
        _wait_until(lambda: makes)
        threads[1].start()
        yield makes, results
    finally:
        release.set()
        for thread in threads:
            thread.join(30)


def test_a_render_waiting_for_pixels_being_made_holds_none_of_the_budget(monkeypatch) -> None:
    """The pixels' maker reserves its decode's price in its make: a render that had reserved its encoding's before
    waiting for the pixels could leave the maker short for ever (an adversarial run). It reserves once they are
    there to take."""
    path, price = _rocket_and_the_price_of_its_optimized()
    SHARED.clear()
    with _second_render_while_the_first_makes(monkeypatch, path, Limits(max_decode_bytes=price.total + price.output)
                                              ) as (makes, results):
        _wait_until(lambda: any(flight.waiters for flight in SHARED._making.values()))
        assert budget.RESERVATIONS.in_use == price.total
    assert len(results) == 2 and budget.RESERVATIONS.in_use == 0


def test_a_render_waiting_for_pixels_being_made_never_leaves_their_maker_short() -> None:
    """An adversarial run: v2's webp and optimized of a 12 MP WebP share their pixels; the one that only encodes
    reserved its price (44-96 MiB) before its sibling, which makes them, reserved the decode's (252-267 MiB), which
    then never fitted under 288 MiB: each waited on the other for ever, and every later render of the worker
    process queued behind them, the heartbeat keeping the job's lease alive."""
    pool, shared = budget.Reservations(), SharedImages()
    making, results = threading.Event(), []

    def maker():
        with pool.scope(100) as reserve:
            def make():
                making.set()
                _wait_until(lambda: shared._making["key"].waiters or pool.in_use)  # the other waits, or reserved
                reserve.release()
                reserve(80)  # the decode's price
                return Image.new("L", (4, 4))

            results.append(shared.get_or_make("key", make))

    def sharer():
        with pool.scope(100) as reserve:
            results.append(shared.get_or_make("key", lambda: pytest.fail("made twice"),
                                                 lambda _image: reserve(40)))

    threads = [threading.Thread(target=maker, daemon=True), threading.Thread(target=sharer, daemon=True)]
    assert _second_while_the_first_makes(threads, making, 10), "the two renders wait on each other"
    assert len(results) == 2 and results[0] is results[1] and pool.in_use == 0


def test_pixels_made_while_a_render_waited_to_share_them_are_taken_even_if_the_lru_let_them_go(monkeypatch) -> None:
    """It waits for them, then for its encoding's price before it takes them; they were let go meanwhile (other
    jobs' images push them out): made again, they would cost a second decode at the full price."""
    path, price = _rocket_and_the_price_of_its_optimized()
    SHARED.clear()
    monkeypatch.setattr(SHARED, "capacity_bytes", 0)  # keeps nothing: let go at once
    # a budget of one render's price: the second one's encoding waits until the first is done
    with _second_render_while_the_first_makes(monkeypatch, path, Limits(max_decode_bytes=price.total)
                                              ) as (makes, results):
        _wait_until(lambda: any(flight.waiters for flight in SHARED._making.values()))
    assert len(results) == 2 and makes == ["optimized"]
    assert budget.RESERVATIONS.in_use == 0
