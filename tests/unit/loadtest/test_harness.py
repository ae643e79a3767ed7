"""What the harness reads from ``/v1/capacity`` and how the report lays the bounds beside the
measured capacity."""

from __future__ import annotations

from cadenza.loadtest.harness import ServerCapacity
from cadenza.loadtest.report import build_report, markdown

BODY = {
    "max_streams": 3,
    "bounds": {
        "throughput_streams": 12.8,
        "long_context_throughput_streams": 5.3,
        "realtime_streams": 6,
        "realtime_short_context_streams": 11,
    },
}


def test_the_claim_and_every_bound_are_read_from_the_capacity_body() -> None:
    read = ServerCapacity.from_body(BODY)
    assert read == ServerCapacity(3, 12.8, 5.3, 6, 11)
    report = build_report(
        {}, [], 4, read.throughput_streams, server_claim=(read.claim, 4),
        ideal_long_context_streams=read.long_context_throughput_streams,
        realtime_bound=(read.realtime_streams, read.realtime_short_context_streams),
    )  # fmt: skip
    assert report["realtime_bound_streams"] == 6
    assert report["capacity_vs_realtime_bound"] == round(4 / 6, 3)
    assert report["realtime_bound_short_context_streams"] == 11
    assert report["capacity_vs_ideal"] == round(4 / 12.8, 3)
    text = markdown(report)
    assert "6 nominal streams (capacity / that = 0.667), 11 at short contexts" in text


def test_a_server_without_calibration_or_with_garbage_reports_no_bound() -> None:
    assert ServerCapacity.from_body(None) == ServerCapacity()
    uncalibrated = {"max_streams": 2, "bounds": None, "calibration": None}
    assert ServerCapacity.from_body(uncalibrated) == ServerCapacity(claim=2)
    garbage = {
        "max_streams": "many",
        "bounds": {
            "throughput_streams": -1,
            "long_context_throughput_streams": "?",
            "realtime_streams": 2.5,
            "realtime_short_context_streams": True,
        },
    }
    assert ServerCapacity.from_body(garbage) == ServerCapacity()
    report = build_report({}, [], None, None)
    assert report["realtime_bound_streams"] is None
    assert report["capacity_vs_realtime_bound"] is None
    assert "None nominal streams" in markdown(report)
