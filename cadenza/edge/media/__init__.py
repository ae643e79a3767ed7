"""Audio media for the edge (PyAV, numpy; no torch): the OpenAI response containers, raw
Opus packets for real-time transports, stateful resampling, tempo change, WAV/PCM.

``containers`` (``open_encoder(fmt, sample_rate)``: WAV and PCM written directly; MP3, Ogg
Opus, AAC in ADTS and FLAC muxed by PyAV into memory, cut to each codec's frame size), ``opus``
(one 20 ms packet at 48 kHz in and out), ``resampler`` (libswresample with carried filter
state), ``tempo`` (FFmpeg's ``atempo`` for the OpenAI ``speed``) and ``wav`` (PCM and a
streaming WAV header). PyAV ships libopus, LAME and FFmpeg's AAC and FLAC encoders, so no
system codec library is needed. A container's duration agrees with its audio within 0.25 s
(encoder priming adds about 50 ms to MP3 and AAC).
"""
