"""Neural audio codecs, in the engine process: codes to audio, offline and streaming.

:func:`load_codec` builds one by name (``encodec_24khz``: EnCodec 24 kHz through
``transformers``; ``snac_24khz``: SNAC 24 kHz; both from a fixed seed) or from a local
checkpoint (EnCodec, SNAC, DAC, or Mimi, also from a Sesame CSM directory). Every codec follows
:class:`~cadenza.codecs.codec.AudioCodec`; its streaming decoder is exact (equal to offline
decoding for any chunking) and batched across streams.
"""

from cadenza.codecs.codec import AudioCodec, CodecError, StreamingDecoder
from cadenza.codecs.registry import load_codec

__all__ = ["AudioCodec", "CodecError", "StreamingDecoder", "load_codec"]
