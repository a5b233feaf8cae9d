"""Id prefixes (``app.core.id_prefixes``): what an operator may type, and when it names one id."""

from __future__ import annotations

import uuid

import pytest

from app.core.id_prefixes import MIN_PREFIX, AmbiguousId, unique_among, uuid_bounds

WHOLE = "afbb4f8a-38b2-4c1e-9f0a-1234567890ab"


def test_a_whole_uuid_in_any_spelling_is_exact():
    for spelling in (WHOLE, WHOLE.upper(), WHOLE.replace("-", ""), f"urn:uuid:{WHOLE}"):
        assert uuid_bounds(spelling) == (uuid.UUID(WHOLE), uuid.UUID(WHOLE))


def test_a_prefix_is_the_range_of_uuids_that_start_with_it():
    for prefix in ("afbb4f8a-38b", "AFBB4F8A38B", "afbb4f8a-38b2-"):
        low, high = uuid_bounds(prefix)
        digits = prefix.lower().replace("-", "")
        assert low.hex == digits.ljust(32, "0") and high.hex == digits.ljust(32, "f")
        assert low <= uuid.UUID(WHOLE) <= high
    low, high = uuid_bounds("afbb")
    assert str(low) == "afbb0000-0000-0000-0000-000000000000" and str(high) == "afbbffff-ffff-ffff-ffff-ffffffffffff"


@pytest.mark.parametrize("typed", ["", "a" * (MIN_PREFIX - 1), "afbg", "afb-b4f8a", "afbb4f8a38b-2", WHOLE + "0",
                                   "afbb4f8a-38b2-4c1e-9f0a-1234567890abc", "a" * 33])
def test_anything_else_is_refused(typed):
    with pytest.raises(ValueError):
        uuid_bounds(typed)


def test_among_strings_an_exact_id_wins_and_a_prefix_must_be_unique():
    ids = ["afbb4f8a-1", "afbb4f8a-2", "afbc0000-1", "abc"]
    assert unique_among("afbb4f8a-2", ids, what="message") == "afbb4f8a-2"
    assert unique_among("afbc", ids, what="message") == "afbc0000-1"
    assert unique_among("abc", ids, what="message") == "abc", "a short id matches exactly"
    assert unique_among("afb", ids, what="message") is None, "a short prefix matches nothing"
    assert unique_among("ffff", ids, what="message") is None
    with pytest.raises(AmbiguousId) as raised:
        unique_among("afbb", ids, what="message")
    assert raised.value.candidates == ["afbb4f8a-1", "afbb4f8a-2"]
    assert "'afbb' starts 2 message ids" in str(raised.value) and "afbb4f8a-2" in str(raised.value)
