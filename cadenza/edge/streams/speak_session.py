"""The rules of a speak session, without I/O: what the WebSocket endpoint and the WebRTC control
channel do with each client message (the websockets library's sans-I/O shape: data in, events
out).

A session plays one utterance at a time::

    client message          session state         events out
    speak                   idle                  StartUtterance(id)      (id = 1, 2, ...)
    resume                  idle                  ResumeUtterance(id)     (a stream of a lost
                                                                           connection or node)
    speak, resume           playing               Send(error busy)
    text, flush, text_end   playing a text stream FeedText(id, ...)       (the text stream's
                                                                           text; anything else
                                                                           gets an error)
    cancel                  playing               StopUtterance(id), Send(done cancelled)
    close                   any                   [StopUtterance, Send(done)], CloseConnection(1000)
    ping {data}             any                   Send(pong {data})
    reset_conversation      any                   Send(conversation {turns: 0, audio_s: 0})
    (a conversation utterance ends)               Send(conversation {turns, audio_s})
    audio_in / binary       any (WebSocket)       (microphone audio kept for speech prompts)
    garbage                 any                   Send(error <code>)   the session goes on
    (nothing for idle_timeout_s while idle)       Send(error idle_timeout), CloseConnection(4000)

The transport executes the events in order (a ``StopUtterance`` is awaited before the ``Send``
after it) and calls :meth:`SpeakSession.utterance_ended` when an utterance it started ends,
however it ends, with what it said. A ``speak`` with ``conversation`` sends the session's
:class:`~cadenza.edge.streams.conversation.Conversation` as context; the turns it adds (the user's
microphone audio, the model's answer) join the conversation only once the answer was said to
its end, so a refused, failed or cancelled ``speak`` leaves the conversation as it was (its
microphone audio is used up: send it again to retry).
Transport-specific checks of a ``speak`` (the formats and rates each one offers) come in as
``check_speak``; the codec rate of the model a ``speak`` names (what its microphone audio is
resampled to) as ``codec_rate``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cadenza.contract.request import ContextTurn, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.streams import protocol
from cadenza.edge.streams.conversation import Conversation, SaidFrames
from cadenza.edge.streams.microphone import MicrophoneBuffer
from cadenza.edge.streams.protocol import (
    AudioIn,
    Cancel,
    Close,
    Flush,
    Hello,
    Ping,
    ProtocolError,
    ResetConversation,
    Resume,
    Speak,
    Text,
    TextEnd,
)

CLOSE_NORMAL = 1000
CLOSE_IDLE = 4000


@dataclass(frozen=True)
class Send:
    """A text message for the client."""

    text: str


@dataclass(frozen=True)
class StartUtterance:
    """Admit and play ``speak`` as utterance ``stream_id``, its audio at ``sample_rate``."""

    stream_id: int
    speak: Speak
    sample_rate: int
    prompt_audio: bytes | None = None  # float32 at the codec's rate, when use_audio_prompt
    prompt_sample_rate: int = 24000
    context: tuple[ContextTurn, ...] = ()  # conversation mode: the turns before the text

    def synthesis_request(self, default_sampling: SamplingParams) -> SynthesisRequest:
        """The engine request, unset sampling settings taken from ``default_sampling`` (a text
        stream's: what its segments have in common, its text the first piece)."""
        return SynthesisRequest(
            request_id=uuid.uuid4().hex,
            text=self.speak.first_text,
            voice=self.speak.voice,
            max_duration_s=self.speak.max_duration_s,
            sampling=self.speak.sampling(default_sampling),
            prompt_audio=self.prompt_audio,
            prompt_sample_rate=self.prompt_sample_rate,
            context=self.context,
        )


@dataclass(frozen=True)
class ResumeUtterance:
    """Go on with the stream ``resume`` names, as utterance ``stream_id`` of this session (the
    transport claims its checkpoint, and refuses it with an ``error`` if it cannot)."""

    stream_id: int
    resume: Resume


@dataclass(frozen=True)
class FeedText:
    """Text for the text stream ``stream_id``: ``text`` to append, then a ``flush`` or its
    ``end`` when set."""

    stream_id: int
    text: str = ""
    flush: bool = False
    end: bool = False


@dataclass
class _TextInFlight:
    """The text stream playing: how much text it had, whether its text ended."""

    stream_id: int
    chars: int
    ended: bool = False


@dataclass(frozen=True)
class _ConversationTurn:
    """A conversation utterance in flight: what joins the conversation if it speaks."""

    stream_id: int
    model: str
    speak: Speak
    user_audio: bytes | None
    user_sample_rate: int  # the codec's rate, which user_audio is at


@dataclass(frozen=True)
class StopUtterance:
    """Cancel utterance ``stream_id`` now (its audio stops, its stream ends)."""

    stream_id: int


@dataclass(frozen=True)
class CloseConnection:
    code: int


@dataclass(frozen=True)
class Renew:
    """A ``hello`` in an open session: renew the session's credential with ``credential`` (a
    fresh client token of the same client, before the one it opened with expires). The
    transport answers ``authenticated``, or an ``error`` and the session keeps its own."""

    credential: str


Event = Send | StartUtterance | ResumeUtterance | FeedText | StopUtterance | CloseConnection | Renew

SpeakCheck = Callable[[Speak], int]
"""The transport's own check of a ``speak``: the sample rate its audio will have, or
:class:`ProtocolError`."""


class SpeakSession:
    def __init__(
        self,
        *,
        check_speak: SpeakCheck,
        codec_rate: SpeakCheck,
        max_prompt_audio_s: float,
        binary_audio: bool,
        idle_timeout_s: float | None = None,
        max_context_s: float = 120.0,
        max_message_chars: int = 4096,
        max_text_stream_chars: int = 20_000,
    ) -> None:
        """``binary_audio``: binary messages carry microphone audio (WebSocket) rather than
        being refused (the WebRTC control channel, whose microphone is a track).
        ``max_context_s``: the conversation's bound (seconds of audio in its turns).
        ``max_message_chars``: the most text one ``speak`` or ``text`` message carries;
        ``max_text_stream_chars``: the most one text stream receives in all."""
        self.check_speak = check_speak
        self.codec_rate = codec_rate
        self.max_prompt_audio_s = max_prompt_audio_s
        self.binary_audio = binary_audio
        self.idle_limit_s = idle_timeout_s
        self.active_stream_id: int | None = None
        self.microphone: MicrophoneBuffer | None = None
        self._stream_ids = itertools.count(1)
        self.conversation = Conversation(max_context_s)
        self.max_message_chars = max_message_chars
        self.max_text_stream_chars = max_text_stream_chars
        self._turn: _ConversationTurn | None = None
        self._text: _TextInFlight | None = None

    # -- input ------------------------------------------------------------------------------

    def receive_text(self, text: str) -> list[Event]:
        try:
            message = protocol.parse_client_message(text)
        except ProtocolError as exc:
            return [Send(protocol.error_message(exc.code, exc.message))]
        if isinstance(message, Speak):
            return self._speak(message)
        if isinstance(message, Resume):
            return self._resume(message)
        if isinstance(message, Text | Flush | TextEnd):
            return self._feed(message)
        if isinstance(message, Cancel):
            return self._stop()
        if isinstance(message, Close):
            return [*self._stop(), CloseConnection(CLOSE_NORMAL)]
        if isinstance(message, Ping):
            return [Send(protocol.server_message("pong", data=message.data))]
        if isinstance(message, ResetConversation):
            self.conversation.reset()
            self._turn = None  # an answer playing now does not join the new conversation
            return [Send(protocol.server_message("conversation", turns=0, audio_s=0.0))]
        if isinstance(message, AudioIn):
            if self.binary_audio:
                self.microphone = MicrophoneBuffer(
                    message.format, message.sample_rate, self.max_prompt_audio_s
                )
            return []
        assert isinstance(message, Hello)
        return [Renew(message.api_key)]  # the session opened authenticated: this renews it

    def receive_bytes(self, data: bytes) -> list[Event]:
        if not self.binary_audio:
            return [Send(protocol.error_message("unexpected_binary", "send JSON text messages"))]
        if self.microphone is None:
            message = "send audio_in before binary microphone audio"
            return [Send(protocol.error_message("unexpected_binary", message))]
        try:
            self.microphone.append_bytes(data)
        except ProtocolError as exc:
            return [Send(protocol.error_message(exc.code, exc.message))]
        return []

    def hear(self, samples: np.ndarray, sample_rate: int) -> None:
        """Microphone audio from a media track (float32 mono)."""
        if self.microphone is None or self.microphone.sample_rate != sample_rate:
            self.microphone = MicrophoneBuffer("pcm", sample_rate, self.max_prompt_audio_s)
        self.microphone.append_samples(samples)

    def utterance_ended(self, stream_id: int, said: SaidFrames | None = None) -> list[Event]:
        """The transport's utterance ``stream_id`` is over (finished, failed or stopped);
        ``said``: what it said. For a conversation utterance, returns the ``conversation``
        message to send (its turns joined the conversation if it was said to its end)."""
        if self.active_stream_id == stream_id:
            self.active_stream_id = None
        if self._text is not None and self._text.stream_id == stream_id:
            self._text = None
        turn = self._turn
        if turn is None or turn.stream_id != stream_id:
            return []
        self._turn = None
        codes = None if said is None else said.codes()
        if said is None or not said.complete or codes is None:
            return [Send(self._conversation_message())]
        frame_rate = said.frame_rate
        speak = turn.speak
        if turn.user_audio is not None and speak.user_voice is not None:
            self.conversation.add_user_turn(
                turn.model, speak.user_voice, speak.user_text, turn.user_audio,
                turn.user_sample_rate,
            )  # fmt: skip
        text = speak.first_text if said.text is None else said.text
        self.conversation.add_model_turn(turn.model, speak.voice, text, codes, frame_rate)
        return [Send(self._conversation_message())]

    # -- time -------------------------------------------------------------------------------

    def idle_timeout_s(self) -> float | None:
        """How long to wait for the next client message (``None``: no limit, because an
        utterance plays or the transport has no idle limit)."""
        return None if self.active_stream_id is not None else self.idle_limit_s

    def timed_out(self) -> list[Event]:
        """Nothing came within :meth:`idle_timeout_s`."""
        return [
            Send(protocol.error_message("idle_timeout", "no activity")),
            CloseConnection(CLOSE_IDLE),
        ]

    # -- rules ------------------------------------------------------------------------------

    def _speak(self, speak: Speak) -> list[Event]:
        if self.active_stream_id is not None:
            message = "an utterance is playing; cancel it first"
            return [Send(protocol.error_message("busy", message))]
        stream_id = next(self._stream_ids)
        try:
            sample_rate = self.check_speak(speak)
            if speak.text_stream:
                self._text = _TextInFlight(stream_id, len(speak.first_text))
            if speak.conversation:
                return self._converse(speak, stream_id, sample_rate)
            codec_rate = self.codec_rate(speak)
            prompt = self._take_prompt(codec_rate) if speak.use_audio_prompt else None
        except ProtocolError as exc:
            self._text = None
            return [Send(protocol.error_message(exc.code, exc.message, stream_id))]
        self.active_stream_id = stream_id
        return [StartUtterance(stream_id, speak, sample_rate, prompt, codec_rate)]

    def _feed(self, message: Text | Flush | TextEnd) -> list[Event]:
        """A text stream's ``text``, ``flush`` or ``text_end``; an ``error`` (the stream goes
        on) for one that names no playing text stream, comes after ``text_end`` or carries
        too much text."""
        stream_id = message.stream_id
        stream = self._text
        try:
            if stream is None or stream.stream_id != stream_id:
                raise ProtocolError(
                    "unknown_stream", f"stream {stream_id} is not a text stream that is playing"
                )
            if stream.ended:
                raise ProtocolError("text_ended", f"stream {stream_id}'s text has ended")
            if isinstance(message, Flush):
                return [FeedText(stream_id, flush=True)]
            if isinstance(message, TextEnd):
                stream.ended = True
                return [FeedText(stream_id, end=True)]
            if len(message.text) > self.max_message_chars:
                raise ProtocolError(
                    "text_too_long",
                    f"a text message carries {len(message.text)} characters; the limit is "
                    f"{self.max_message_chars}",
                )
            if stream.chars + len(message.text) > self.max_text_stream_chars:
                raise ProtocolError(
                    "text_too_long",
                    f"a text stream may receive {self.max_text_stream_chars} characters",
                )
        except ProtocolError as exc:
            return [Send(protocol.error_message(exc.code, exc.message, stream_id))]
        stream.chars += len(message.text)
        return [FeedText(stream_id, text=message.text)]

    def _resume(self, resume: Resume) -> list[Event]:
        if self.active_stream_id is not None:
            message = "an utterance is playing; cancel it first"
            return [Send(protocol.error_message("busy", message))]
        stream_id = next(self._stream_ids)
        if (resume.samples_heard is None) == (resume.frames_heard is None):
            message = "resume: give samples_heard (pcm, opus) or frames_heard (encodec)"
            return [Send(protocol.error_message("invalid_message", message, stream_id))]
        self.active_stream_id = stream_id
        return [ResumeUtterance(stream_id, resume)]

    def _converse(self, speak: Speak, stream_id: int, sample_rate: int) -> list[Event]:
        """A ``speak`` in conversation mode: the conversation (and the user's new turn, from
        the microphone) as context. Raises :class:`ProtocolError`."""
        model = speak.model or ""
        if not self.conversation.belongs_to(model):
            raise ProtocolError(
                "conversation_model",
                f"this session's conversation is with model "
                f"{self.conversation.model or 'the default'!r}; send reset_conversation first",
            )
        context = self.conversation.turns
        codec_rate = self.codec_rate(speak)
        user_audio = None
        if speak.use_audio_prompt:
            if speak.user_voice is None:
                raise ProtocolError(
                    "invalid_message", "user_voice: the speaker id of the microphone audio"
                )
            user_audio = self._take_prompt(codec_rate)
            user = ContextTurn(voice=speak.user_voice, text=speak.user_text, audio=user_audio)
            context = (*context, user)
        self.active_stream_id = stream_id
        self._turn = _ConversationTurn(stream_id, model, speak, user_audio, codec_rate)
        start = StartUtterance(stream_id, speak, sample_rate, None, codec_rate, context=context)
        return [start]

    def _conversation_message(self) -> str:
        return protocol.server_message(
            "conversation",
            turns=len(self.conversation.turns),
            audio_s=round(self.conversation.audio_s, 2),
        )

    def _take_prompt(self, codec_rate: int) -> bytes:
        if self.microphone is None:
            raise ProtocolError("no_prompt_audio", "no microphone audio has been received")
        return self.microphone.take(codec_rate)

    def _stop(self) -> list[Event]:
        stream_id = self.active_stream_id
        if stream_id is None:
            return []
        self.active_stream_id = None
        self._text = None
        done = protocol.server_message("done", stream_id=stream_id, reason="cancelled")
        return [StopUtterance(stream_id), Send(done)]
