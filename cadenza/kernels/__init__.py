"""Attention and quantized-op kernels the model runner calls.

Today: the torch reference attention over a contiguous per-sequence KV cache
(:mod:`cadenza.kernels.attention`). Paged attention and Triton kernels build on it.
"""
