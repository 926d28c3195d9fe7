"""`retryfs.core.proof.verdict`: what the state after a commit proves, against the state before
it and the digest of the bytes written."""

from __future__ import annotations

import pytest

from retryfs.core.proof import UNCHANGED, UNKNOWN, ObjectState, WriteDigest, verdict
from retryfs.errors import CommitNotVisibleError

BEFORE = ObjectState(size=10, modified="Sun, 06 Dec 2026 15:00:00 GMT", etag="a" * 32 + "-2")


def test_an_object_just_as_before_is_unchanged_not_merely_false():
    found = verdict(BEFORE, 10, None, BEFORE)
    assert found is UNCHANGED and not found and found.retry_after == 1.0
    # its error asks for the commit to be made again a second later; a plain False does not
    assert CommitNotVisibleError.written("b/k", 10, found).retry_after == 1.0
    assert CommitNotVisibleError.copied("b/k", 10, False).retry_after is None


@pytest.mark.parametrize(("after", "before", "expected"), [
    (None, BEFORE, False),  # nothing there
    (ObjectState(size=9), BEFORE, False),  # another size
    (ObjectState(size=10, modified="Sun, 06 Dec 2026 15:00:01 GMT", etag=BEFORE.etag),
     BEFORE, True),  # a second later
    (ObjectState(size=10, modified=BEFORE.modified, etag="b" * 32 + "-2"), BEFORE, True),
    (BEFORE, None, True),  # nothing was there before
    (BEFORE, UNKNOWN, True),  # nothing to compare with: the size
    (BEFORE, ObjectState(size=10), True),  # a store that shows neither date nor ETag
])
def test_what_the_state_after_proves(after, before, expected):
    assert verdict(after, 10, None, before) is expected


def test_a_hashed_write_is_proven_by_its_etag_even_within_the_second():
    digest = WriteDigest()
    digest.update(memoryview(b"0123456789"))
    same = ObjectState(size=10, modified=BEFORE.modified, etag=digest.hexdigest)
    assert verdict(same, 10, digest, same) is True
