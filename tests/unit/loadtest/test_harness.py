"""What the harness reads from ``/v1/capacity`` and how the report lays the bounds beside the
measured capacity, and where the audio's way out stalled."""

from __future__ import annotations

from cadenza.loadtest.harness import ServerCapacity
from cadenza.loadtest.level_summary import summarize_level
from cadenza.loadtest.report import build_report, markdown
from cadenza.loadtest.server_metrics import MetricsWindow, parse_metrics

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


def test_stalls_on_the_way_out_are_counted_from_the_scrapes_and_shown_by_where() -> None:
    def scrape(edge_total: float, edge_fast: float, out_total: float, out_fast: float) -> str:
        return "\n".join(
            [
                "# TYPE cadenza_edge_loop_lag_seconds histogram",
                f'cadenza_edge_loop_lag_seconds_bucket{{le="0.1"}} {edge_fast}',
                f'cadenza_edge_loop_lag_seconds_bucket{{le="+Inf"}} {edge_total}',
                f"cadenza_edge_loop_lag_seconds_count {edge_total}",
                "cadenza_edge_loop_lag_seconds_sum 0.5",
                "# TYPE cadenza_engine_output_delay_seconds histogram",
                f'cadenza_engine_output_delay_seconds_bucket{{le="0.1",model="m"}} {out_fast}',
                f'cadenza_engine_output_delay_seconds_bucket{{le="+Inf",model="m"}} {out_total}',
                f'cadenza_engine_output_delay_seconds_count{{model="m"}} {out_total}',
                'cadenza_engine_output_delay_seconds_sum{model="m"} 0.1',
                "",
            ]
        )

    window = MetricsWindow()
    window.add(parse_metrics(scrape(10, 9, 50, 50)))  # one stall before the level: not its own
    window.add(parse_metrics(scrape(70, 67, 450, 447)))
    server = window.summary()
    assert (server["edge_loop_stalls"], server["delayed_outputs"]) == (2, 3)
    level = summarize_level(4, [], server=server, client_loop={"max_lag_ms": 130.5, "stalls": 1})
    report = build_report({}, [level], None, None)
    assert "| 2 / 3 / 1 (max 130.5 ms) |" in markdown(report)
    bare = build_report({}, [summarize_level(4, [])], None, None)
    assert "| - / - / - |" in markdown(bare)


def test_admitted_streams_are_counted_by_the_node_that_served_them() -> None:
    from cadenza.loadtest.level_summary import StreamResult
    from cadenza.loadtest.playout import Playout

    played = Playout(audio_s=1.0, longest_underrun_s=0.0, total_underrun_s=0.0, underruns=())
    results = [
        StreamResult("served", 0.0, ttfa_s=0.1, playout=played, node="node-a"),
        StreamResult("served", 0.1, ttfa_s=0.1, playout=played, node="node-b"),
        StreamResult("queued_served", 0.2, ttfa_s=0.3, playout=played, node="node-a"),
        StreamResult("refused", 0.3, reason="queue_full", node="node-b"),
    ]
    level = summarize_level(4, results)
    assert level["admitted_by_node"] == {"node-a": 2, "node-b": 1}
    assert level["streams"][0]["node"] == "node-a"
    text = markdown(build_report({}, [level], None, None))
    assert "- 4 streams: node-a 2, node-b 1" in text
    assert "by node" not in markdown(build_report({}, [summarize_level(4, [])], None, None))
