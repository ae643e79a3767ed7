"""The payloads of a WebSocket stream's binary audio messages, per format (docs/protocol.md):
``pcm`` s16le at the stream's rate, ``opus`` one 20 ms packet each, ``encodec`` the codec
frames as uint16 codes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cadenza.contract.request import StreamOutput
from cadenza.edge.media.opus import OpusPacketEncoder
from cadenza.edge.media.resampler import StreamResampler
from cadenza.edge.media.wav import float_to_s16le

PayloadEncoder = Callable[[StreamOutput, bool], list[tuple[bytes, float]]]


def payload_encoder(fmt: str, native_rate: int, rate: int, frame_rate: float) -> PayloadEncoder:
    """A function turning each engine output into ``(payload, audio seconds)`` pairs."""
    if fmt == "encodec":
        frame_s = 1.0 / frame_rate

        def encodec(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
            codes = output.codes
            if codes is None or not codes.size:
                return []
            return [(codes.astype("<u2").tobytes(), codes.shape[0] * frame_s)]

        return encodec
    if fmt == "opus":
        opus = OpusPacketEncoder(native_rate)

        def opus_packets(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
            packets = opus.encode(output.audio)
            if final:
                packets += opus.finish()
            return [(packet, 0.02) for packet in packets]

        return opus_packets
    resampler = StreamResampler(native_rate, rate)

    def pcm(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
        samples = resampler.process(output.audio)
        if final:
            samples = np.concatenate([samples, resampler.flush()])
        if not samples.size:
            return []
        return [(float_to_s16le(samples), samples.size / rate)]

    return pcm
