"""Neural audio codecs (EnCodec via transformers) and audio containers.

:func:`load_codec` is the entry point; :mod:`cadenza.codecs.wav` writes the containers the edge
streams today (WAV and raw PCM). The codec modules import torch and live in the engine process;
the container modules use numpy only and serve the edge.
"""
