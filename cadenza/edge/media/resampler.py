"""Stateful sample-rate conversion of float32 mono chunks (PyAV's libswresample).

The converter keeps its filter history between chunks, so a signal resampled chunk by chunk has
no discontinuity at the chunk boundaries; :meth:`flush` returns what the filter still holds.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

SUPPORTED_RATES = (8000, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


class ResampleError(ValueError):
    pass


class StreamResampler:
    def __init__(self, in_rate: int, out_rate: int) -> None:
        for rate in (in_rate, out_rate):
            if rate not in SUPPORTED_RATES:
                raise ResampleError(
                    f"sample rate {rate} is not supported; use one of {SUPPORTED_RATES}"
                )
        self.in_rate, self.out_rate = in_rate, out_rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=out_rate)
        self._pts = 0

    def process(self, audio: np.ndarray) -> np.ndarray:
        """float32 samples at ``in_rate`` -> float32 samples at ``out_rate`` (may be fewer
        than the exact ratio until :meth:`flush`)."""
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        if samples.ndim != 1:
            raise ResampleError(f"audio must be mono [samples], got shape {samples.shape}")
        if self.in_rate == self.out_rate or not samples.size:
            return samples.copy()
        frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        frame.sample_rate = self.in_rate
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, self.in_rate)
        self._pts += samples.size
        return _concat(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        if self.in_rate == self.out_rate:
            return np.zeros(0, np.float32)
        return _concat(self._resampler.resample(None))


def resample(audio: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """A whole signal (float32 mono at ``in_rate``) at ``out_rate``: one converter, flushed.
    Raises :class:`ResampleError` for a rate it does not take."""
    resampler = StreamResampler(in_rate, out_rate)
    return np.concatenate([resampler.process(audio), resampler.flush()])


def _concat(frames: list[av.AudioFrame]) -> np.ndarray:
    if not frames:
        return np.zeros(0, np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)
