"""Failed attempts per address: a sliding window, bounded memory."""

from __future__ import annotations

import pytest

from cadenza.edge.auth.auth_failures import AuthFailures


def test_failures_leave_the_window_and_memory_is_bounded() -> None:
    failures = AuthFailures(max_failures=2, window_s=10, max_addresses=3)
    failures.failed("a", now=0.0)
    failures.failed("a", now=1.0)
    assert failures.retry_after_s("a", now=5.0) == pytest.approx(5.0)
    assert failures.retry_after_s("a", now=10.5) is None
    for address in "bcde":
        failures.failed(address, now=20.0)
    assert len(failures._failures) <= 3
    failures.failed(None)  # an unknown address is never remembered
