"""KV memory arithmetic, defined once for the engine, admission and ``cadenza plan``.

Per token, a decoder stores a key and a value per layer and KV head::

    kv_bytes_per_token = 2 * layers * kv_heads * head_dim * bytes(kv_dtype)   (+ int8 scales)

An int8 cache also keeps one float16 scale per token, layer, KV head and K/V, which adds
``2 * layers * kv_heads * 2`` bytes per token. Llama 3 8B (32 layers, 8 KV heads of width 128,
BF16) needs 131,072 bytes per token: exactly 1 GiB for an 8,192-token sequence.

Memory is handed out in pages of ``page_size`` tokens. A stream holds the pages of its prompt
and of every step it may still generate (:class:`StreamShape`); the engine reserves exactly
that, and the edge estimates it before the prompt exists, from the text's UTF-8 length (a
byte-level or BPE tokenizer never makes more tokens than bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from cadenza.contract.stream_length import NOMINAL_TEXT, steps_for_frames

KV_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}
INT8_SCALE_BYTES = 2  # float16, one per token, layer, KV head and K/V


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """Bytes one token's keys and values take in every layer. Raises ``KeyError`` for an
    unknown ``kv_dtype`` (one of :data:`KV_DTYPE_BYTES`)."""
    per_token = 2 * num_layers * num_kv_heads * head_dim * KV_DTYPE_BYTES[kv_dtype]
    if kv_dtype == "int8":
        per_token += 2 * num_layers * num_kv_heads * INT8_SCALE_BYTES
    return per_token


def pages_for_tokens(num_tokens: int, page_size: int) -> int:
    """Pages that hold ``num_tokens`` tokens (the last one may be partly empty)."""
    return -(-max(num_tokens, 0) // page_size)


@dataclass(frozen=True)
class StreamShape:
    """How a model's streams use KV memory: what admission needs to cost one.

    ``prompt_overhead_tokens``: prompt tokens besides the text's and the speech prompt's (the
    voice, special tokens), for the longest voice. ``max_context_tokens``: where a model's
    streams run through several contexts that each start afresh (Bark's stages and windows),
    the most tokens one holds: a stream never holds more, whatever its length;
    ``context_rows_per_frame``: the prompt rows such a stream prefills per frame of audio as
    its contexts restart (0 for every other model), work admission prices beside the decode
    steps (:mod:`cadenza.edge.admission.capacity`)."""

    page_size: int
    steps_per_frame: int
    tail_steps: int
    prompt_overhead_tokens: int
    max_context_tokens: int | None = None
    context_rows_per_frame: float = 0.0

    def steps_for_frames(self, num_frames: int) -> int:
        return steps_for_frames(num_frames, self.steps_per_frame, self.tail_steps)

    @property
    def nominal_prompt_tokens(self) -> int:
        """The most tokens the nominal stream's prompt takes (its text:
        :data:`~cadenza.contract.stream_length.NOMINAL_TEXT`)."""
        return self.max_prompt_tokens(NOMINAL_TEXT)

    def max_prompt_tokens(self, text: str, prompt_audio_frames: int = 0) -> int:
        """The most tokens a prompt for ``text`` (after that many speech-prompt frames) can
        take: one per UTF-8 byte at most, plus the overhead."""
        text_tokens = len(text.encode("utf-8", errors="replace"))
        return (
            text_tokens + self.prompt_overhead_tokens + prompt_audio_frames * self.steps_per_frame
        )

    def pages(self, prompt_tokens: int, num_frames: int) -> int:
        """Pages a stream holds at most: its prompt and every step of its output (at most a
        context's worth, for a model whose contexts restart)."""
        tokens = prompt_tokens + self.steps_for_frames(num_frames)
        if self.max_context_tokens is not None:
            tokens = min(tokens, self.max_context_tokens)
        return pages_for_tokens(tokens, self.page_size)
