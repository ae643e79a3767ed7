"""Python SDK for cadenza's WebSocket protocol (``WS /v1/stream``).

::

    from cadenza.client import connect

    async with connect("ws://127.0.0.1:8000/v1/stream") as session:
        async for chunk in session.speak("Hello.", format="pcm"):
            play(chunk.data)  # 16-bit PCM at chunk.sample_rate

Leaving the ``async for`` early cancels the utterance on the server. :func:`speak_sync` is
the blocking one-liner for scripts. ``api_key`` takes a key or a client token; an app server
mints tokens for its browsers with :func:`mint_client_token`.
"""

from cadenza.client.client_tokens import ClientToken, TokenMintError, mint_client_token
from cadenza.client.sdk import AudioChunk, Session, StreamError, connect, speak_sync

__all__ = [
    "AudioChunk",
    "ClientToken",
    "Session",
    "StreamError",
    "TokenMintError",
    "connect",
    "mint_client_token",
    "speak_sync",
]
