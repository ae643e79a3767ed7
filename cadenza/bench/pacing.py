"""``cadenza bench pacing``: WebRTC peers speak at once against a running server; the server
reports, per peer, the p99 of how late each 20 ms frame left its paced track and the playout
underruns its jitter buffer saw. Measures the edge's pacing under load (the engine shares the
machine, as in production). Every peer is the same client to the server: with more than
``server.max_pending_webrtc_offers_per_client`` (4) peers, start the server with that limit
raised, or the peers past it are refused with ``too_many_offers``."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from cadenza.client.webrtc import WebRTCPeer


async def _one(url: str, index: int, text: str) -> dict[str, Any]:
    peer = WebRTCPeer(url)
    try:
        await peer.connect()
        peer.send({"type": "speak", "text": text, "seed": index})
        await peer.next_event({"started"}, timeout_s=60)
        jitter: list[float] = []
        while True:
            event = await peer.next_event({"stats", "done", "error"}, timeout_s=120)
            if event["type"] == "stats" and event.get("send_jitter_p99_ms") is not None:
                jitter.append(event["send_jitter_p99_ms"])
            if event["type"] in ("done", "error"):
                break
        return {
            "outcome": event["type"],
            "send_jitter_p99_ms": max(jitter) if jitter else None,
            "underruns": (event.get("stats") or {}).get("underruns"),
            "ttfa_ms": (event.get("stats") or {}).get("ttfa_ms"),
        }
    finally:
        await peer.close()


def run(url: str, peers: int, seconds: float) -> dict[str, Any]:
    text = "x" * int(14 * seconds)

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_one(url, i, text) for i in range(peers)))

    results = asyncio.run(main())
    jitter = [r["send_jitter_p99_ms"] for r in results if r["send_jitter_p99_ms"] is not None]
    return {
        "benchmark": "pacing",
        "peers": peers,
        "seconds_per_peer": seconds,
        "send_jitter_p99_ms": {"median": statistics.median(jitter), "max": max(jitter)}
        if jitter
        else None,
        "underruns_total": sum(r["underruns"] or 0 for r in results),
        "ttfa_ms_median": statistics.median(r["ttfa_ms"] for r in results if r["ttfa_ms"]),
        "peers_detail": results,
    }
