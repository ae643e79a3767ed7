"""A stream whose text arrives while it plays (``speak`` with ``text_stream``): one lease, one
segment after another, one gapless audio stream.

The transport feeds the client's ``text``, ``flush`` and ``text_end`` messages in
(:meth:`TextStream.append`, :meth:`~TextStream.flush`, :meth:`~TextStream.end`) and plays what
:meth:`TextStream.play` yields::

    SegmentStarted(index, text)    a segment goes to the engine (the transport says ``segment``)
    StreamOutput ...               its audio, as any stream's; no finish_reason until the last
    WaitingForText()               everything so far is said; the next text has not come
    StreamOutput(finish_reason)    the last, empty: the text ended (see ``end_reason``)

Each segment (:mod:`cadenza.edge.streams.text_segmenter` cuts them) is its own engine request
on the stream's one admission lease (:meth:`StreamLease.speak_next`), sent as soon as it is
complete and the previous segment's generation is over. Generation runs ahead of playout (the
engine decodes up to ``realtime.max_lead_ms`` ahead of a stream's deadlines), so the next
segment's prefill and first chunk happen while the listener still hears the previous one:
whenever text arrives faster than it is spoken, segments follow each other with no gap. A
stream waiting for text has no engine request, so it costs no decode work; its slot stays
held. Every segment keeps the stream's voice, speech prompt and sampling (a seed ``s`` becomes
``s + index``); a model that takes context (Sesame CSM) hears, before each segment, the
stream's conversation context and its ``text_stream.context_segments`` previous segments
(their text and the codec frames they were said with).

A stream that has said everything ends when its text ended, or with ``end_reason``
``text_timeout`` after ``text_stream.idle_timeout_s`` without new text; one that would need
more than ``text_stream.max_segments`` segments fails with ``too_many_segments``; one that a
drain ends while it waits for text fails with ``shutting_down``. Each segment is charged to the
client's audio-seconds bucket as it starts (:meth:`StreamLease.charge_segment`). Under a client
token's ``max_audio_s`` the whole stream, not each segment, plays at most that long: each
segment may last what the stream has left, and a stream that has said it all ends with
``end_reason`` ``length``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import numpy as np

from cadenza.config import CadenzaConfig
from cadenza.config.text_stream import TextStreamConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.request import ContextTurn, FinishReason, StreamOutput, SynthesisRequest
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams import protocol
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease
from cadenza.edge.streams.protocol import Speak
from cadenza.edge.streams.speak_session import FeedText
from cadenza.edge.streams.text_segmenter import TextSegmenter

Clock = Callable[[], float]
_CUT_POLL_S = 0.5  # how often a stream waiting for text looks whether a drain ended it


@dataclass(frozen=True)
class SegmentStarted:
    """Segment ``index`` (from 0) of the stream, ``text``, went to the engine."""

    index: int
    text: str


@dataclass(frozen=True)
class WaitingForText:
    """The stream said everything it had; it waits for text (silence that is no underrun)."""


TextStreamItem = StreamOutput | SegmentStarted | WaitingForText


class TextStream:
    def __init__(
        self,
        config: TextStreamConfig,
        template: SynthesisRequest,
        *,
        takes_context: bool,
        clock: Clock = time.monotonic,
        one_sentence: bool = False,
    ) -> None:
        """``template``: the stream's request as admitted (voice, prompt, sampling, context);
        each segment is a copy with its own id, text and context. ``one_sentence``: segments
        are single sentences (:class:`TextSegmenter`)."""
        self.config = config
        self.template = template
        self.takes_context = takes_context
        self.clock = clock
        self.segmenter = TextSegmenter(config, one_sentence)
        self.segments: list[str] = []
        self.end_reason = "eos"
        self._said: list[ContextTurn] = []  # segments said, for models that take context
        self._changed = asyncio.Event()
        self._last_text_at = clock()

    @property
    def spoken_text(self) -> str:
        """The segments handed to the engine so far, joined by spaces."""
        return " ".join(self.segments)

    # -- the client's messages --------------------------------------------------------------

    def append(self, text: str) -> None:
        self.segmenter.append(text, self.clock())
        self._last_text_at = self.clock()
        self._changed.set()

    def flush(self) -> None:
        self.segmenter.flush()
        self._last_text_at = self.clock()
        self._changed.set()

    def end(self) -> None:
        self.segmenter.end()
        self._changed.set()

    # -- playing ----------------------------------------------------------------------------

    async def play(
        self, lease: StreamLease, principal: Principal
    ) -> AsyncGenerator[TextStreamItem, None]:
        """The stream's items (see the module docstring), its segments spoken on ``lease``
        for ``principal``, each checked as a whole text is (its length, the input guard) and
        all of them within its audio per stream. Raises :class:`EdgeError`."""
        waiting = False
        budget_s = principal.max_audio_s  # None: the stream's length is its text's
        said_s = 0.0
        while True:
            segment = self.segmenter.next_segment(self.clock())
            if segment is None:
                if self.segmenter.exhausted:
                    break
                if self.segments and not waiting:
                    waiting = True
                    yield WaitingForText()
                if not await self._wait_for_text(lease):
                    self.end_reason = "text_timeout"
                    break
                continue
            if len(self.segments) >= self.config.max_segments:
                message = f"the text needs more than {self.config.max_segments} segments"
                raise EdgeError(400, message, code="too_many_segments", param="text")
            left_s = None if budget_s is None else budget_s - said_s
            if left_s is not None and left_s * lease.sample_rate < 1:
                self.end_reason = "length"
                break
            await lease.admission.check_segment(segment, principal.client)
            await lease.charge_segment(segment)
            lease.speak_next(self._request(segment, left_s))
            self.segments.append(segment)
            waiting = False
            yield SegmentStarted(len(self.segments) - 1, segment)
            codes: list[np.ndarray] = []
            async for output in lease.outputs():
                said_s += len(output.audio) / lease.sample_rate
                if output.codes is not None and output.codes.size:
                    codes.append(output.codes)
                if output.finish_reason in (FinishReason.EOS, FinishReason.LENGTH):
                    yield dataclasses.replace(output, finish_reason=None)
                    break
                yield output
                if output.finished:  # cancelled or failed: the stream ends with it
                    return
            self._remember(segment, codes)
        lease.finish(self.end_reason)
        yield StreamOutput(
            self.template.request_id, np.zeros(0, np.float32), finish_reason=FinishReason.EOS
        )

    async def _wait_for_text(self, lease: StreamLease) -> bool:
        """Wait for text, a flush, the end of the text or the wait limit; ``False`` once
        ``text_stream.idle_timeout_s`` passed without text while the stream had nothing to
        say. Raises :class:`EdgeError` ``shutting_down`` when a drain ends the stream."""
        idle_deadline = max(self._last_text_at, self.clock()) + self.config.idle_timeout_s
        while True:
            if lease.cut_reason is not None:
                raise EdgeError(503, lease.cut_reason, code="shutting_down")
            now = self.clock()
            if self.segmenter.next_segment_due(now) or self.segmenter.ended:
                return True
            if now >= idle_deadline:
                return False
            ready = self.segmenter.ready_at()
            wake = idle_deadline if ready is None else min(ready, idle_deadline)
            wake = min(wake, now + _CUT_POLL_S)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wake - now, 0.001)):
                    await self._changed.wait()
            if self._changed.is_set():
                return True

    def _request(self, segment: str, left_s: float | None) -> SynthesisRequest:
        """The engine request of ``segment``; ``left_s``: the most audio it may still last."""
        template = self.template
        max_duration_s = template.max_duration_s
        if left_s is not None:
            max_duration_s = left_s if max_duration_s is None else min(max_duration_s, left_s)
        sampling = template.sampling
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + len(self.segments))
        context = template.context
        if self.takes_context and self.config.context_segments:
            context = (*context, *self._said[-self.config.context_segments :])
        return dataclasses.replace(
            template,
            request_id=uuid.uuid4().hex,
            text=segment,
            sampling=sampling,
            context=context,
            max_duration_s=max_duration_s,
        )

    def _remember(self, segment: str, codes: list[np.ndarray]) -> None:
        if not self.takes_context or not codes:
            return
        frames = tuple(tuple(int(c) for c in row) for row in np.concatenate(codes).tolist())
        self._said.append(ContextTurn(voice=self.template.voice, text=segment, codes=frames))
        del self._said[: -max(self.config.context_segments, 1)]


def open_text_stream(
    config: CadenzaConfig, request: SynthesisRequest, info: EngineInfo, speak: Speak
) -> TextStream:
    """The text stream a ``speak`` with ``text_stream`` opens, its first piece appended."""
    stream = TextStream(config.text_stream, request, takes_context=info.takes_context)
    if speak.first_text:
        stream.append(speak.first_text)
    return stream


def sentence_by_sentence(
    config: CadenzaConfig, request: SynthesisRequest, info: EngineInfo
) -> TextStream | None:
    """A whole text of more than one sentence, for a model that speaks long text in segments
    (``info.segments_text``: Bark), as a text stream whose text has all arrived, cut sentence by
    sentence: its first audio comes after its first sentence, and each next sentence is
    generated while the one before plays. ``None`` for any other model or text (one stream)."""
    if not info.segments_text:
        return None
    probe = TextSegmenter(config.text_stream, one_sentence=True)
    probe.append(request.text, 0.0)
    probe.end()
    if probe.next_segment(0.0) is None or probe.next_segment(0.0) is None:
        return None
    stream = TextStream(
        config.text_stream, request, takes_context=info.takes_context, one_sentence=True
    )
    stream.append(request.text)
    stream.end()
    return stream


async def audio_only(
    items: AsyncGenerator[TextStreamItem, None],
) -> AsyncGenerator[StreamOutput, None]:
    """A text stream's outputs without its segment and waiting markers (a transport that has
    no message for them: HTTP)."""
    async with contextlib.aclosing(items):
        async for item in items:
            if isinstance(item, StreamOutput):
                yield item


def feed_text(stream: TextStream | None, event: FeedText) -> None:
    """Carry out a session's :class:`FeedText` (``stream``: ``None`` once it has ended)."""
    if stream is None:
        return
    if event.text:
        stream.append(event.text)
    if event.flush:
        stream.flush()
    if event.end:
        stream.end()


def segment_message(stream_id: int, started: SegmentStarted) -> str:
    """The ``segment`` message: segment ``index`` of the stream, ``text``, is being spoken."""
    return protocol.server_message(
        "segment", stream_id=stream_id, index=started.index, text=started.text
    )
