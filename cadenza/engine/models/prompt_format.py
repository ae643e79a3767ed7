"""How a Llama-family speech model's prompt is spelled in token ids.

Two forms exist among the public models:

* :class:`TokenPrompt`: fixed prefix ids, the voice's own ids, a speech prompt's audio tokens,
  the text's ids, fixed suffix ids (each piece tokenized on its own).
* :class:`TemplatePrompt`: fixed prefix ids, then the voice and text written into one string
  (Orpheus: ``"{voice}: {text}"``) and tokenized together, as the model was trained (a BPE
  tokenizer merges the space into the next word, so tokenizing the pieces apart gives
  different ids), then fixed suffix ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

TextEncoder = Callable[[str], list[int]]


class PromptFormat(Protocol):
    voices: tuple[str, ...]

    def token_ids(self, text: str, voice: str, audio_ids: list[int]) -> list[int]:
        """The prompt for ``text`` in ``voice`` (a name from :attr:`voices`), after a speech
        prompt's audio token ids. Raises ``ValueError`` for what the format cannot express."""
        ...


class TokenPrompt:
    def __init__(
        self,
        encode_text: TextEncoder,
        voice_ids: dict[str, list[int]],
        prefix_ids: list[int],
        suffix_ids: list[int],
    ) -> None:
        self.encode_text = encode_text
        self.voice_ids = voice_ids
        self.voices = tuple(voice_ids)
        self.prefix_ids = prefix_ids
        self.suffix_ids = suffix_ids

    def token_ids(self, text: str, voice: str, audio_ids: list[int]) -> list[int]:
        return [
            *self.prefix_ids,
            *self.voice_ids[voice],
            *audio_ids,
            *self.encode_text(text),
            *self.suffix_ids,
        ]


class TemplatePrompt:
    def __init__(
        self,
        encode_text: TextEncoder,
        template: str,
        voices: tuple[str, ...],
        prefix_ids: list[int],
        suffix_ids: list[int],
    ) -> None:
        if "{text}" not in template:
            raise ValueError(f"prompt template {template!r} has no {{text}}")
        self.encode_text = encode_text
        self.template = template
        self.voices = voices
        self.prefix_ids = prefix_ids
        self.suffix_ids = suffix_ids

    def token_ids(self, text: str, voice: str, audio_ids: list[int]) -> list[int]:
        if audio_ids:
            raise ValueError("this model's prompt format takes no speech prompt")
        written = self.template.replace("{voice}", voice).replace("{text}", text)
        return [*self.prefix_ids, *self.encode_text(written), *self.suffix_ids]
