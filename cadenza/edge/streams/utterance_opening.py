"""Admitting a session's ``speak``, for the WebSocket and WebRTC alike: the model it names,
its engine request (seeded where checkpoints need it), a text stream when its text is still
arriving (or, for a model that speaks long text in segments, when its whole text is longer than
one sentence: :func:`~cadenza.edge.streams.text_stream.sentence_by_sentence`), and its
admission lease::

    opened = await open_utterance(state, start, principal, "websocket", on_queued=queued)
    items = opened.lease.outputs() if opened.text is None else opened.text.play(...)

A refusal raises :class:`EdgeError` (the model, admission's own)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cadenza.contract.engine_info import EngineInfo
from cadenza.edge.admission.ticket import QueuedCallback
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.checkpoints import StreamHead, seeded
from cadenza.edge.streams.lease import StreamLease, Transport
from cadenza.edge.streams.speak_session import StartUtterance
from cadenza.edge.streams.text_stream import TextStream, open_text_stream, sentence_by_sentence

if TYPE_CHECKING:
    from cadenza.edge.server.state import EdgeState


@dataclass(frozen=True)
class OpenedUtterance:
    """An admitted ``speak``: its model's announcement, lease and checkpoint head, and its
    text stream (``None``: its text was whole and is one request)."""

    info: EngineInfo
    lease: StreamLease
    head: StreamHead
    text: TextStream | None


async def open_utterance(
    state: EdgeState,
    start: StartUtterance,
    principal: Principal,
    transport: Transport,
    *,
    audio_format: str,
    on_queued: QueuedCallback | None = None,
    on_text_stream: Callable[[TextStream], None] | None = None,
) -> OpenedUtterance:
    """Admit ``start`` for ``principal``; its audio goes out as ``audio_format`` at
    ``start.sample_rate``. With checkpoints, a whole text's stream gets a seed (see
    :func:`seeded`); a text stream is not checkpointed. ``on_text_stream``: called with a
    text stream as soon as it exists, before admission, so that text arriving while it waits
    for its slot is kept. Raises :class:`EdgeError`."""
    speak = start.speak
    service = state.service(speak.model, transport=transport)
    info = service.info()
    request = start.synthesis_request(info.default_sampling)
    text = None
    if speak.text_stream:
        text = open_text_stream(state.config, request, info, speak)
        if on_text_stream is not None:
            on_text_stream(text)
    elif (whole := sentence_by_sentence(state.config, request, info)) is not None:
        text = whole
    elif state.checkpoints is not None:
        request = seeded(request)
    lease = await service.admission.open(
        transport=transport,
        principal=principal,
        request=request,
        priority=speak.priority,
        on_queued=on_queued,
        text_stream=text is not None,
    )
    head = StreamHead(
        service.name,
        principal.client,
        audio_format,
        start.sample_rate,
        lease.request,
        speak.priority,
    )
    return OpenedUtterance(info, lease, head, text)
