"""Where streamed text is cut into segments, without I/O or a clock of its own.

Text arrives in pieces (a language model's tokens). :meth:`TextSegmenter.next_segment` is asked
whenever the stream has nothing left to say, and answers with the next segment to speak, or
``None`` to wait for more text. A segment ends, in this order of preference:

1. at a **sentence end** (``.``, ``!``, ``?``, ``…`` and their CJK forms, closing quotes or
   brackets after them, then a space or a new line; a new line alone ends one too): as many
   complete sentences as fit in ``segment_max_chars`` go together, so a stream that fell
   behind its text catches up in fewer, longer segments;
2. at a **clause boundary** (``,``, ``;``, ``:`` or a dash, then a space) once the segment is
   ``clause_min_chars`` long;
3. at the last space before ``segment_max_chars`` (the **length limit**; a text with no space
   there is cut at the limit);
4. wherever the text stands, at its last space, once its oldest unspoken piece has waited
   ``segment_wait_ms`` (the **wait limit**);
5. at the end of what had arrived when the client said ``flush``, or at the end of the text
   after ``text_end``.

With ``one_sentence`` (a model that speaks a long text sentence by sentence, so that its first
audio comes after the first sentence), a segment ends at the *first* sentence end instead:
sentences are never grouped.

Sentence punctuation that ends the text so far ends a sentence at once, unless it follows a
digit (``3.`` may become ``3.14``: the space after it, a flush, the end of the text or the
wait limit settles that). Common abbreviations (``Mr.``, ``e.g.``) and initials do not end
sentences. Segments are stripped; whitespace alone
is never a segment.
"""

from __future__ import annotations

import re

from cadenza.config.text_stream import TextStreamConfig

_SENTENCE_END = re.compile(r"(?:[.!?…]+[\"'”’)\]]*\s|[。！？]+[\"'”’)\]」』]*|\n)")
_CLAUSE_END = re.compile(r"(?:[,;:][\"'”’)\]]*\s|\s[-–—]{1,2}\s|[—–][\"'”’)\]]*\s|[，；：、])")
_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no",
        "fig", "approx", "dept", "est", "inc", "ltd", "mt",
    }
)  # fmt: skip


class TextSegmenter:
    def __init__(self, config: TextStreamConfig, one_sentence: bool = False) -> None:
        self.config = config
        self.one_sentence = one_sentence
        self._pending = ""
        self._pending_since: float | None = None  # when the oldest unspoken text arrived
        self._flush_to = 0  # characters of pending text that a flush asked to be spoken
        self.ended = False
        self.received_chars = 0

    @property
    def pending(self) -> str:
        """Text that arrived and is not spoken yet."""
        return self._pending

    @property
    def exhausted(self) -> bool:
        """The text ended and every segment of it was handed out."""
        return self.ended and not self._pending.strip()

    def append(self, text: str, now: float) -> None:
        if self.ended:
            raise ValueError("text after text_end")
        if text and self._pending_since is None and (self._pending + text).strip():
            self._pending_since = now
        self._pending += text
        self.received_chars += len(text)

    def flush(self) -> None:
        """Everything that has arrived is to be spoken without waiting for a boundary."""
        self._flush_to = len(self._pending)

    def end(self) -> None:
        """No more text comes: what is left is the last segment."""
        self.ended = True

    def ready_at(self) -> float | None:
        """When the wait limit makes the unspoken text a segment (``None``: no unspoken text)."""
        if self._pending_since is None:
            return None
        return self._pending_since + self.config.segment_wait_ms / 1000

    def next_segment_due(self, now: float) -> bool:
        """Whether :meth:`next_segment` would cut a segment (or drop trailing whitespace)."""
        return self._cut(now) is not None

    def next_segment(self, now: float) -> str | None:
        """The next segment to speak now, or ``None`` when it is better to wait for text."""
        while True:
            cut = self._cut(now)
            if cut is None:
                return None
            segment = self._pending[:cut].strip()
            self._pending = self._pending[cut:]
            self._flush_to = max(self._flush_to - cut, 0)
            self._pending_since = now if self._pending.strip() else None
            if segment:
                return segment

    def _cut(self, now: float) -> int | None:
        """How many characters of the pending text the next segment takes (``None``: wait)."""
        text, limit = self._pending, self.config.segment_max_chars
        if not text.strip():
            if text and (self.ended or self._flush_to):
                return len(text)  # drop trailing whitespace
            return None
        if self.one_sentence:
            first = _first_boundary(_SENTENCE_END, text, limit, _is_sentence_end)
            if first is not None:
                return first
        sentence = _last_boundary(_SENTENCE_END, text, limit, 1, _is_sentence_end)
        if len(text) <= limit and _ends_a_sentence(text):
            return len(text)
        if sentence is not None:
            return sentence
        clause = _last_boundary(_CLAUSE_END, text, limit, self.config.clause_min_chars)
        if clause is not None:
            return clause
        if len(text) > limit:
            return _last_space(text, limit) or limit
        if self._flush_to or self.ended:
            return min(max(self._flush_to, len(text) if self.ended else 0), len(text))
        ready = self.ready_at()
        if ready is not None and now >= ready:
            return _last_space(text, len(text)) or len(text)
        return None


def _last_boundary(
    pattern: re.Pattern[str],
    text: str,
    limit: int,
    min_chars: int,
    accept: object = None,
) -> int | None:
    """The end of the last match of ``pattern`` that leaves a segment of ``min_chars`` to
    ``limit`` characters (``accept(text, match)`` may veto a match)."""
    best = None
    for match in pattern.finditer(text):
        end = match.end()
        if end > limit:
            break
        if end < min_chars or (callable(accept) and not accept(text, match)):
            continue
        best = end
    return best


def _first_boundary(
    pattern: re.Pattern[str], text: str, limit: int, accept: object = None
) -> int | None:
    """The end of the first match of ``pattern`` within ``limit`` characters that
    ``accept(text, match)`` does not veto."""
    for match in pattern.finditer(text):
        if match.end() > limit:
            return None
        if not callable(accept) or accept(text, match):
            return match.end()
    return None


_FINAL_END = re.compile(r"(?<=[^\d\s])[.!?…。！？]+[\"'”’)\]」』]*$")


def _ends_a_sentence(text: str) -> bool:
    """Whether the text so far ends a sentence without waiting for what follows: sentence
    punctuation after a word, not after a digit (``3.`` may become ``3.14``), an abbreviation
    or an initial."""
    match = _FINAL_END.search(text)
    return match is not None and _is_sentence_end(text, match)


def _is_sentence_end(text: str, match: re.Match[str]) -> bool:
    """Whether a period ends a sentence rather than an abbreviation (``Dr.``, ``e.g.``) or an
    initial (``J. Smith``)."""
    if not match.group().startswith("."):
        return True
    words = text[: match.start()].split()
    word = words[-1].lower().strip("\"'(“‘") if words else ""
    return word not in _ABBREVIATIONS and not (len(word) == 1 and word.isalpha())


def _last_space(text: str, limit: int) -> int | None:
    """The end of the last whitespace run within ``text[:limit]`` (``None``: none)."""
    for index in range(min(limit, len(text)) - 1, 0, -1):
        if text[index].isspace():
            return index + 1
    return None
