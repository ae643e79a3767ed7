import pytest

from cadenza.edge.admission.rate_limit import RateLimited, RateLimiter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_requests_bucket_refills_continuously():
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=2, audio_seconds_per_minute=0, clock=clock)
    limiter.admit("a", 5)
    limiter.admit("a", 5)
    with pytest.raises(RateLimited) as caught:
        limiter.admit("a", 5)
    assert caught.value.reason == "request" and caught.value.retry_after_s == pytest.approx(30)
    limiter.admit("b", 5)  # other clients have their own buckets
    clock.now = 30
    limiter.admit("a", 5)


def test_audio_bucket_charges_the_estimate_and_settles_the_rest():
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=0, audio_seconds_per_minute=60, clock=clock)
    grant = limiter.admit("a", 50)
    with pytest.raises(RateLimited) as caught:
        limiter.admit("a", 20)
    assert caught.value.reason == "audio" and caught.value.retry_after_s == pytest.approx(10)
    limiter.settle(grant, used_audio_s=10)  # the utterance ended early: 40 s come back
    limiter.admit("a", 20)


def test_a_request_larger_than_the_bucket_waits_for_a_full_bucket():
    clock = Clock()
    limiter = RateLimiter(0, audio_seconds_per_minute=10, clock=clock)
    limiter.admit("a", 300)  # a full bucket lets it through
    with pytest.raises(RateLimited):
        limiter.admit("a", 300)
    clock.now = 10_000
    limiter.admit("a", 300)


def test_unlimited_by_default():
    limiter = RateLimiter(0, 0)
    for _ in range(1000):
        limiter.admit("a", 1000)


def test_a_refund_gives_back_the_request_and_all_its_audio():
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=1, audio_seconds_per_minute=60, clock=clock)
    grant = limiter.admit("a", 50)
    with pytest.raises(RateLimited):
        limiter.admit("a", 50)
    limiter.refund(grant)  # it never started (refused for capacity)
    limiter.admit("a", 50)


def test_more_audio_of_a_stream_charges_no_request():
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=1, audio_seconds_per_minute=60, clock=clock)
    limiter.admit("a", 10)
    limiter.admit("a", 30, request_count=0)  # a text stream's next segment
    with pytest.raises(RateLimited) as caught:
        limiter.admit("a", 30, request_count=0)
    assert caught.value.reason == "audio"
    with pytest.raises(RateLimited) as caught:
        limiter.admit("a", 1)
    assert caught.value.reason == "request"
