"""One stream from the client's side, per transport: send the request, timestamp every audio
chunk as it lands, and classify the outcome. Each returns a :class:`StreamResult`.

* ``ws``: the SDK (:mod:`cadenza.client`), 16-bit PCM at the codec rate, one connection per
  virtual user reused across its utterances; queue notices and ``started.queued_s`` tell a
  queued stream from an immediate one.
* ``http``: ``POST /v1/audio/speech`` with ``response_format=pcm`` (24 kHz 16-bit), read as
  it streams; a 503 or 429 is a refusal with the error's code as the reason.
* ``webrtc``: an aiortc peer; the server paces audio into the track, so its jitter buffer's
  report (``done.stats``: first audio, underruns) stands in for client-side arrival times.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from cadenza.client.sdk import Session, StreamError
from cadenza.loadtest.level_summary import StreamResult
from cadenza.loadtest.playout import Chunk, Playout, Underrun, simulate_playout
from cadenza.loadtest.workload import LoadOptions, as_sentences, llm_tokens

REFUSAL_CODES = frozenset(
    {
        "queue_full",
        "queue_timeout",
        "too_large",
        "rate_limited",
        "quota_unavailable",
        "engine_unavailable",
    }
)
HTTP_PCM_RATE = 24000
NODE_HEADER = "x-cadenza-node"  # the server's node name (cadenza/edge/node_identity.py)


def _outcome_of_error(code: str) -> str:
    return "refused" if code in REFUSAL_CODES else "error"


async def ws_stream(
    session: Session, text: str, options: LoadOptions, level_start: float, seed: int
) -> StreamResult:
    """One utterance over an open SDK session (its text streamed in with
    ``options.text_stream_tokens_per_s``)."""
    if options.text_stream_tokens_per_s is not None:
        return await ws_text_stream(session, text, options, level_start, seed)
    sent = time.monotonic()
    resumes = session.resumes
    chunks: list[Chunk] = []
    rate = 0
    try:
        async for chunk in session.speak(
            text,
            format="pcm",
            priority=options.priority,
            seed=seed,
            model=options.model,
            voice=options.voice or "default",
            max_duration_s=options.max_duration_s,
        ):
            now = time.monotonic()
            rate = chunk.sample_rate
            chunks.append(Chunk(now, len(chunk.data) / 2 / rate))
    except StreamError as exc:
        return _ws_failed(exc, chunks, sent - level_start)
    result = _ws_served(session, chunks, sent, level_start, options)
    if session.resumes > resumes:
        result.resumed, result.resume_gap_s = True, session.last_resume_gap_s
    return result


async def ws_text_stream(
    session: Session, text: str, options: LoadOptions, level_start: float, seed: int
) -> StreamResult:
    """One utterance whose text arrives as a language model streams it: ``text`` in sentences,
    cut into tokens sent at ``options.text_stream_tokens_per_s``. Besides what any stream
    reports: the listener's wait at each segment after the first, and the time from the last
    token to the end of the audio."""
    assert options.text_stream_tokens_per_s is not None
    period_s = 1.0 / options.text_stream_tokens_per_s
    last_text: list[float] = []

    async def tokens() -> AsyncIterator[str]:
        """Token ``i`` exists ``i`` periods after the request: the stream's admission does
        not hold the language model back."""
        for index, token in enumerate(llm_tokens(as_sentences(text))):
            await asyncio.sleep(max(sent + index * period_s - time.monotonic(), 0.0))
            yield token
        last_text.append(time.monotonic())

    sent = time.monotonic()
    chunks: list[Chunk] = []
    segment_starts: list[int] = []  # chunk index where each segment after the first begins
    rate = 0
    try:
        async for chunk in session.speak_stream(
            tokens(),
            format="pcm",
            priority=options.priority,
            seed=seed,
            model=options.model,
            voice=options.voice or "default",
            max_duration_s=options.max_duration_s,
        ):
            rate = chunk.sample_rate
            if chunk.segment and (not segment_starts or chunk.segment > len(segment_starts)):
                segment_starts.append(len(chunks))
            chunks.append(Chunk(time.monotonic(), len(chunk.data) / 2 / rate))
    except StreamError as exc:
        return _ws_failed(exc, chunks, sent - level_start)
    result = _ws_served(session, chunks, sent, level_start, options)
    if result.playout is not None and last_text:
        starved = result.playout.starved_s
        result.segment_gaps_s = tuple(starved[i] for i in segment_starts if i < len(starved))
        result.text_to_end_s = result.playout.ends_s - last_text[0]
    return result


async def http_stream(
    client: httpx.AsyncClient, text: str, options: LoadOptions, level_start: float, seed: int
) -> StreamResult:
    body = {
        "model": options.model or "cadenza-tiny",
        "voice": options.voice or "default",
        "input": text,
        "response_format": "pcm",
        "priority": options.priority,
        "seed": seed,
    }
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    sent = time.monotonic()
    chunks: list[Chunk] = []
    try:
        async with client.stream(
            "POST", f"{options.url}/v1/audio/speech", json=body, headers=headers
        ) as response:
            node = response.headers.get(NODE_HEADER)
            if response.status_code != 200:
                await response.aread()
                code = _error_code(response.content) or f"http_{response.status_code}"
                outcome = "refused" if response.status_code in (429, 503) else "error"
                return StreamResult(outcome, sent - level_start, reason=code, node=node)
            carry = 0
            async for data in response.aiter_raw():
                usable = (len(data) + carry) // 2 * 2 - carry
                carry = (carry + len(data)) % 2
                chunks.append(Chunk(time.monotonic(), max(usable, 0) / 2 / HTTP_PCM_RATE))
    except httpx.HTTPError as exc:
        reason = type(exc).__name__
        return StreamResult("error", sent - level_start, reason=reason, broken=bool(chunks))
    result = _served(chunks, sent, level_start, options, queued=False, queued_s=0.0)
    result.node = node
    return result


async def webrtc_stream(text: str, options: LoadOptions, level_start: float) -> StreamResult:
    """One utterance over a fresh aiortc peer (connection set-up is not counted in TTFA)."""
    from cadenza.client.webrtc import WebRTCPeer  # aiortc: only when this transport is used

    peer = WebRTCPeer(options.url, api_key=options.api_key)
    try:
        await peer.connect()
        sent = time.monotonic()
        speak = {"type": "speak", "text": text, "priority": options.priority}
        if options.model is not None:
            speak["model"] = options.model
        if options.voice is not None:
            speak["voice"] = options.voice
        peer.send(speak)
        started = await peer.next_event({"started", "error"}, timeout_s=60)
        if started["type"] == "error":
            code = str(started.get("code"))
            return StreamResult(_outcome_of_error(code), sent - level_start, reason=code)
        done = await peer.next_event({"done", "error"}, timeout_s=600)
        if done["type"] == "error":
            code = str(done.get("code"))
            return StreamResult("error", sent - level_start, reason=code, broken=True)
    except Exception as exc:
        return StreamResult("error", time.monotonic() - level_start, type(exc).__name__)
    finally:
        await peer.close()
    stats: dict[str, Any] = done.get("stats") or {}
    queued_s = float(started.get("queued_s") or 0.0)
    ttfa = stats.get("ttfa_ms")
    longest = float(stats.get("longest_underrun_ms") or 0.0) / 1000.0
    audio_s = float(stats.get("audio_s") or 0.0)
    playout = Playout(
        audio_s=audio_s,
        longest_underrun_s=longest,
        total_underrun_s=longest * int(stats.get("underruns") or 0),
        underruns=(Underrun(0.0, longest),) if longest else (),
        generation_s=audio_s,
    )
    return StreamResult(
        "queued_served" if queued_s > 0.001 else "served",
        sent - level_start,
        queued_s=queued_s,
        ttfa_s=None if ttfa is None else queued_s + float(ttfa) / 1000.0,
        playout=playout,
        node=peer.node,
    )


def _ws_failed(exc: StreamError, chunks: list[Chunk], sent_s: float) -> StreamResult:
    """A WebSocket stream the server refused, or that broke after its audio had started (an
    error then, whatever the code)."""
    if chunks:
        return StreamResult("error", sent_s, reason=exc.code, broken=True)
    return StreamResult(_outcome_of_error(exc.code), sent_s, reason=exc.code)


def _ws_served(
    session: Session, chunks: list[Chunk], sent: float, level_start: float, options: LoadOptions
) -> StreamResult:
    """A WebSocket stream that played: queued or not (a queue notice or ``started.queued_s``),
    its playout, the node that served it."""
    started = session.last_started or {}
    queued_s = float(started.get("queued_s") or 0.0)
    queued = session.last_queued is not None or queued_s > 0.001
    result = _served(chunks, sent, level_start, options, queued, queued_s)
    result.node = session.ready.get("node")
    return result


def _served(
    chunks: list[Chunk],
    sent: float,
    level_start: float,
    options: LoadOptions,
    queued: bool,
    queued_s: float,
) -> StreamResult:
    chunks = [c for c in chunks if c.audio_s > 0]
    if not chunks:
        return StreamResult("error", sent - level_start, reason="no_audio")
    playout = simulate_playout(chunks, options.client_buffer_ms / 1000.0, origin_s=sent)
    return StreamResult(
        "queued_served" if queued else "served",
        sent - level_start,
        queued_s=queued_s,
        ttfa_s=chunks[0].arrival_s - sent,
        playout=playout,
    )


def _error_code(content: bytes) -> str | None:
    try:
        error = json.loads(content).get("error", {})
        return str(error.get("code")) if error.get("code") else None
    except (ValueError, AttributeError):
        return None
