"""The imports the docs promise work as written."""

from __future__ import annotations


def test_documented_imports() -> None:
    from cadenza import Engine, SamplingParams, __version__
    from cadenza.client import connect, speak_sync
    from cadenza.codecs import load_codec
    from cadenza.kernels import paged_decode_attention

    assert callable(load_codec) and callable(paged_decode_attention)
    assert Engine.__name__ == "Engine" and SamplingParams().greedy is False
    assert __version__ and callable(connect) and callable(speak_sync)
