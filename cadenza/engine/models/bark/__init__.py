"""Bark (suno/bark, suno/bark-small in the ``transformers`` layout): three GPT-style stages
(text to semantic tokens, semantic to EnCodec's first two codebooks in sliding windows, a
non-causal model filling in the other six) and the 24 kHz EnCodec codec, run for many streams
at once (:mod:`~cadenza.engine.models.bark.bark_batch`)."""
