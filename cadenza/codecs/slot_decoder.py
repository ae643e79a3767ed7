"""The slot bookkeeping every streaming decoder shares: a fixed number of slots, one per live
stream, each holding that stream's carried state; codes checked before any state changes; one
batched pass over every slot given, chunk lengths free to differ."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from cadenza.codecs.codec import CodecError
from cadenza.codecs.ragged import Lengths
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.kernels.host_upload import upload


class _CheckedCodec(Protocol):
    num_codebooks: int

    @property
    def device(self) -> torch.device: ...

    def check_codes(self, codes: torch.Tensor) -> None: ...


class SlotDecoder(ABC):
    """A :class:`~cadenza.codecs.codec.StreamingDecoder`; subclasses decode the batch and reset a
    slot's state."""

    def __init__(self, codec: _CheckedCodec, max_streams: int) -> None:
        self.checked_codec = codec
        self.max_streams = max_streams
        self._free = list(range(max_streams - 1, -1, -1))  # lowest slot first
        self._open: set[int] = set()

    @property
    def open_slots(self) -> frozenset[int]:
        return frozenset(self._open)

    def open(self) -> int:
        """Start a new stream in a free slot and return it. Raises :class:`CodecError` when
        all ``max_streams`` slots are taken."""
        if not self._free:
            raise CodecError(f"all {self.max_streams} streaming slots are in use")
        slot = self._free.pop()
        self.reset(slot)
        self._open.add(slot)
        return slot

    @torch.inference_mode()
    def decode(
        self, chunks: dict[int, torch.Tensor], final: frozenset[int] = frozenset()
    ) -> dict[int, torch.Tensor]:
        """New codes ``{slot: [K, n]}`` (host tensors) -> new audio ``{slot: float32 [m]}``
        on the host: one batched pass, its audio read back from the codec's device once.

        Slots in ``final`` end with this chunk: everything they hold back is flushed and they
        are closed. Bad codes raise :class:`CodecError` and change no slot's state.
        """
        slot_ids = sorted(chunks)
        for slot in slot_ids:
            if slot not in self._open:
                raise CodecError(f"slot {slot} is not open")
            codes = chunks[slot]
            if codes.dim() != 2:
                raise CodecError(f"codes for slot {slot} must be [codebooks, frames]")
            self.checked_codec.check_codes(codes[None])
        if not slot_ids:
            return {}
        device = self.checked_codec.device
        lengths = [chunks[s].shape[-1] for s in slot_ids]
        # The batch is put together on the host and copied to the device once, without
        # blocking (a copy a slot would each wait for the device on a GPU).
        codes = torch.zeros(
            len(slot_ids), self.checked_codec.num_codebooks, max(lengths), dtype=torch.long
        )
        for index, slot in enumerate(slot_ids):
            codes[index, :, : lengths[index]] = chunks[slot]
        codes = upload(codes, torch.long, device)
        slots = SlotBatch.on(slot_ids, device)
        is_final = [slot in final for slot in slot_ids]
        audio, lengths = self.decode_batch(codes, lengths, slots, is_final)
        # One read of the whole batch (a read a slot would each wait for the device on a GPU).
        host = audio.float().cpu()
        out = {slot: host[i, : lengths[i]] for i, slot in enumerate(slot_ids)}
        for slot in final & set(slot_ids):
            self.release(slot)
        return out

    def close(self, slot: int) -> torch.Tensor | None:
        """End the stream in ``slot`` and free it; returns the audio it still held back, or
        ``None`` when there was none."""
        if slot not in self._open:
            raise CodecError(f"slot {slot} is not open")
        empty = torch.zeros(self.checked_codec.num_codebooks, 0, dtype=torch.long)
        tail = self.decode({slot: empty}, final=frozenset({slot}))[slot]
        return tail if tail.numel() else None

    def release(self, slot: int) -> None:
        """Free ``slot`` without flushing (the stream was cancelled). Idempotent."""
        if slot not in self._open:
            return
        self._open.discard(slot)
        self._free.append(slot)
        self.reset(slot)

    @abstractmethod
    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """Zero-padded codes ``[B, K, max n]`` (row ``b`` holds ``lengths[b]`` frames) ->
        audio ``[B, max m]`` and each row's sample count."""

    @abstractmethod
    def reset(self, slot: int) -> None:
        """Forget ``slot``'s state (it is about to carry a new stream)."""
