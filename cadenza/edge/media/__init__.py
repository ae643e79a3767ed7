"""Audio media for the edge (PyAV, numpy; no torch): the OpenAI response containers, raw
Opus packets for real-time transports, stateful resampling, tempo change, WAV/PCM."""
