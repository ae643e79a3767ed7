"""Bark (suno/bark, suno/bark-small in the ``transformers`` layout): three GPT-style stages
(text to semantic tokens, semantic to EnCodec's first two codebooks in sliding windows, a
non-causal model filling in the other six) and the 24 kHz EnCodec inside the checkpoint,
served by the batching engine like any family.

==================  ==========================================================================
``bark_family``     the registry's record: recognising, loading, pricing a checkpoint
``bark_checkpoint`` the files: config, weights, tokenizer, voices, generation constants
``bark_constants``  special ids, offsets and window sizes from ``generation_config.json``
``bark_voices``     the voice presets
``bark_gpt``        the stages' weights (causal GPT blocks, the non-causal fine GPT)
``bark_model``      the engine's step over both causal stages in the paged KV
``bark_layout``     stages as contexts that restart, fine windows, frames for the codec
``bark_stream``     one stream's progress through the stages
``bark_windows``    each stage's prompts and windows, as ``transformers`` lays them out
==================  ==========================================================================
"""
