"""Streaming tempo change without pitch change (FFmpeg's ``atempo`` through PyAV), for the
OpenAI ``speed`` parameter: 2.0 plays twice as fast, 0.5 half as fast, pitch unchanged.

``atempo`` takes factors in [0.5, 100]; slower speeds chain several 0.5 stages.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

MIN_SPEED, MAX_SPEED = 0.25, 4.0


class TempoChanger:
    def __init__(self, sample_rate: int, speed: float) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
        self.sample_rate = sample_rate
        self.speed = speed
        self._pts = 0
        self._graph = av.filter.Graph()
        node = self._graph.add_abuffer(
            format="flt",
            sample_rate=sample_rate,
            layout="mono",
            time_base=fractions.Fraction(1, sample_rate),
        )
        self._source = node
        remaining = speed
        while remaining < 0.5:
            stage = self._graph.add("atempo", "0.5")
            node.link_to(stage)
            node, remaining = stage, remaining / 0.5
        stage = self._graph.add("atempo", f"{remaining:.6f}")
        node.link_to(stage)
        sink = self._graph.add("abuffersink")
        stage.link_to(sink)
        self._graph.configure()

    def process(self, audio: np.ndarray) -> np.ndarray:
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        if not samples.size:
            return samples
        frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, self.sample_rate)
        self._pts += samples.size
        self._graph.push(frame)
        return self._drain()

    def flush(self) -> np.ndarray:
        self._graph.push(None)
        return self._drain()

    def _drain(self) -> np.ndarray:
        pieces = []
        while True:
            try:
                frame = self._graph.pull()
            except (BlockingIOError, EOFError, av.error.EOFError):
                break
            pieces.append(frame.to_ndarray().reshape(-1))
        if not pieces:
            return np.zeros(0, np.float32)
        return np.concatenate(pieces).astype(np.float32)
