"""Conversation sessions: the turns a session keeps, how they bound themselves, and how a
``speak`` with ``conversation`` sends them and adds to them only when the answer spoke."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.contract.request import FinishReason, StreamOutput
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.streams.conversation import Conversation, SaidFrames
from cadenza.edge.streams.speak_session import Send, StartUtterance
from tests.unit.edge.streams.test_speak_session import (
    new_session,
    pcm,
    sent,
    single_error,
    speak,
    text,
)

FRAME_RATE = 12.5


def codes(frames: int, value: int = 3) -> np.ndarray:
    return np.full((frames, 4), value, dtype=np.uint16)


def test_turns_are_kept_oldest_first_and_bounded_by_their_audio() -> None:
    conversation = Conversation(max_context_s=2.0)
    audio = np.zeros(12000, dtype="<f4").tobytes()  # 0.5 s at 24 kHz
    conversation.add_user_turn("csm", "1", "hi", audio, 24000)
    conversation.add_model_turn("csm", "0", "hello", codes(10), FRAME_RATE)  # 0.8 s
    conversation.add_model_turn("csm", "0", "", codes(0), FRAME_RATE)  # nothing said: no turn
    assert [t.voice for t in conversation.turns] == ["1", "0"]
    assert conversation.turns[1].codes[0] == (3, 3, 3, 3)
    conversation.add_model_turn("csm", "0", "more", codes(12), FRAME_RATE)  # 0.96 s: drop one
    assert [t.text for t in conversation.turns] == ["hello", "more"]
    assert conversation.audio_s == pytest.approx(1.76)
    conversation.add_model_turn("csm", "0", "long", codes(50), FRAME_RATE)  # 4 s alone
    assert conversation.turns == ()


def test_a_conversation_belongs_to_one_model_until_reset() -> None:
    conversation = Conversation(max_context_s=60.0)
    conversation.add_model_turn("csm", "0", "hello", codes(2), FRAME_RATE)
    assert conversation.belongs_to("csm") and not conversation.belongs_to("other")
    with pytest.raises(ValueError, match="reset"):
        conversation.add_model_turn("other", "0", "x", codes(2), FRAME_RATE)
    conversation.reset()
    assert conversation.belongs_to("other") and conversation.model is None


def said(frames: int, reason: FinishReason | None = FinishReason.EOS) -> SaidFrames:
    result = SaidFrames()
    result.frame_rate = FRAME_RATE
    result.add(StreamOutput("r", np.zeros(0, np.float32), reason, codes=codes(frames)))
    return result


def test_said_frames_gathers_an_utterances_codes_and_how_it_ended() -> None:
    gathered = SaidFrames()
    assert gathered.codes() is None and not gathered.complete
    audio = np.zeros(0, np.float32)
    gathered.add(StreamOutput("r", audio))
    gathered.add(StreamOutput("r", audio, codes=codes(2, 1)))
    gathered.add(StreamOutput("r", audio, codes=codes(0)))
    assert not gathered.complete
    gathered.add(StreamOutput("r", audio, FinishReason.LENGTH, codes=codes(3, 2)))
    assert gathered.codes().shape == (5, 4) and gathered.complete
    assert not said(2, FinishReason.CANCELLED).complete


def _conversation_start(session, **fields) -> StartUtterance:
    events = session.receive_text(speak("Answer me.", voice="0", conversation=True, **fields))
    assert len(events) == 1 and isinstance(events[0], StartUtterance), events
    return events[0]


def test_a_session_sends_its_turns_and_adds_the_answer_once_it_spoke() -> None:
    session = new_session()
    first = _conversation_start(session)
    assert first.context == () and first.prompt_audio is None
    events = session.utterance_ended(first.stream_id, said(4))
    assert sent(events[0]) == {"type": "conversation", "turns": 1, "audio_s": 0.32}
    second = _conversation_start(session)
    assert [t.text for t in second.context] == ["Answer me."]
    assert second.synthesis_request(SamplingParams()).context == second.context
    (notice,) = session.utterance_ended(second.stream_id, said(3, FinishReason.CANCELLED))
    assert sent(notice)["turns"] == 1 and len(session.conversation.turns) == 1  # barged in
    assert session.utterance_ended(second.stream_id, said(2)) == []  # over already
    third = _conversation_start(session)
    session.receive_text(text(type="reset_conversation"))  # while it plays
    session.utterance_ended(third.stream_id, said(2))
    assert session.conversation.turns == ()


def test_the_microphone_is_the_users_turn() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in", format="pcm", sample_rate=24000))
    session.receive_bytes(pcm(0.5, 24000))
    start = _conversation_start(session, use_audio_prompt=True, user_voice="1", user_text="Hey")
    (user,) = start.context
    assert user.voice == "1" and user.text == "Hey" and len(user.audio) == 12000 * 4
    session.utterance_ended(start.stream_id, said(2))
    assert [t.voice for t in session.conversation.turns] == ["1", "0"]


def test_conversation_garbage_is_refused_and_changes_nothing() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in", format="pcm", sample_rate=24000))
    session.receive_bytes(pcm(0.2, 24000))
    error = single_error(session.receive_text(speak("x", conversation=True, use_audio_prompt=True)))
    assert error["code"] == "invalid_message" and "user_voice" in error["message"]
    assert single_error(session.receive_text(speak("x", conversation="yes")))["code"] == (
        "invalid_message"
    )
    start = _conversation_start(session)
    session.utterance_ended(start.stream_id, said(2))
    other = session.receive_text(speak("x", model="other", conversation=True))
    assert single_error(other)["code"] == "conversation_model"
    (reset,) = session.receive_text(text(type="reset_conversation"))
    assert isinstance(reset, Send) and sent(reset)["turns"] == 0
    assert isinstance(session.receive_text(speak("x", model="other", conversation=True))[0],
                      StartUtterance)  # fmt: skip
