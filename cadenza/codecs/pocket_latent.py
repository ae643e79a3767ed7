"""The Pocket TTS audio tokenizer (Kyutai's continuous-latent Mimi: 24 kHz, 12.5 frames a
second) through ``transformers``, as a codec of integer frames.

A frame is one latent of the tokenizer's latent space (``latent_dim`` floats, 32 for the
released model, already denormalised: what the Pocket TTS model generates). The engine moves
frames as integer codes, so each float32 value travels as its *bit pattern*, read as a signed
int32 and held in an integer tensor (:func:`latents_to_codes`, :func:`codes_to_latents`):

    latent 0.5 (float32 bits 0x3f000000)  <->  code 1056964608

So ``num_codebooks == latent_dim`` and ``codebook_size == 2**32``: a code is a bit pattern,
not an id into a table; valid codes are the int32 range ``[-2**31, 2**31)`` whose float32 is
finite.

:meth:`PocketLatentCodec.decode` is ``PocketTTSProcessor.decode`` sample for sample: the
tokenizer's decode (latents projected to ``hidden_size``, upsampled 16x by a grouped transposed
conv, a causal sliding-window transformer, the causal SEANet decoder), exactly ``frame_size =
1920`` samples a frame, then a linear fade-in (``torch.linspace(0, 1, int(0.005 * 24000))``)
multiplied onto each waveform's first samples: a fresh decoder state starts with a small step,
heard as a click. Every layer is causal, so a prefix of the frames decodes to the prefix of
the audio (to float rounding) and the streaming decoder
(:mod:`cadenza.codecs.pocket_latent_streaming`) holds nothing back: ``lookahead_frames = 0``.

:meth:`PocketLatentCodec.encode_audio` encodes a voice prompt as ``PocketTTSProcessor`` does
one clip: ``PocketTTSFeatureExtractor`` (by default it ends the clip on a short pause: trailing
silence cut, the end faded out, 0.08 s of zeros appended; then zero-padded to a whole frame),
the tokenizer's encoder, and the frames its ``latents_mask`` keeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import PocketTTSAudioTokenizerModel
from transformers.models.pocket_tts.feature_extraction_pocket_tts import PocketTTSFeatureExtractor

from cadenza.codecs.codec import CodecError
from cadenza.codecs.pretrained_codec import load_strictly
from cadenza.codecs.weight_norm import fold_weight_norm

if TYPE_CHECKING:
    from cadenza.codecs.pocket_latent_streaming import PocketLatentStreamingDecoder

MODEL_TYPE = "pocket_tts_audio_tokenizer"
FADE_IN_S = 0.005
"""``PocketTTSProcessor``'s default ``fade_in_duration``."""

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def latents_to_codes(latents: torch.Tensor) -> torch.Tensor:
    """Latent values (any shape, float) -> their float32 bit patterns as signed int32
    values in a long tensor of the same shape."""
    if not latents.is_floating_point():
        raise CodecError(f"latents must be floats, got {latents.dtype}")
    return latents.to(torch.float32).contiguous().view(torch.int32).long()


def codes_to_latents(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any shape: int32 or int64 holding int32 values) -> the float32 values whose
    bit patterns they are, same shape. Raises :class:`CodecError` for anything else."""
    if codes.dtype not in (torch.int32, torch.int64):
        raise CodecError(f"codes must be integers (float32 bit patterns), got {codes.dtype}")
    if codes.numel() and (codes.min() < _INT32_MIN or codes.max() > _INT32_MAX):
        raise CodecError(
            "codes must be float32 bit patterns read as signed int32, "
            f"in [{_INT32_MIN}, {_INT32_MAX}]"
        )
    return codes.to(torch.int32).view(torch.float32)


class PocketLatentCodec:
    """One Pocket TTS audio tokenizer decoding (and encoding) frames of bit-pattern codes."""

    def __init__(
        self,
        model: PocketTTSAudioTokenizerModel,
        feature_extractor: PocketTTSFeatureExtractor | None = None,
        fade_in_s: float = FADE_IN_S,
    ) -> None:
        config = model.config
        if model.decoder is None:
            raise CodecError("this Pocket TTS audio tokenizer has no decoder")
        # transformers' signatures are narrower than its behaviour: treat the model as untyped.
        self.model: Any = cast(Any, model)
        self.model.eval()
        self.sample_rate: int = config.sampling_rate
        self.frame_size: int = config.frame_size
        self.frame_rate: float = config.frame_rate
        self.num_codebooks: int = config.latent_dim
        self.codebook_size: int = 2**32  # codes are float32 bit patterns, not ids
        self.lookahead_frames = 0  # causal: a frame's audio needs no later frame
        self.streaming_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
        if feature_extractor is None:
            feature_extractor = PocketTTSFeatureExtractor(  # type: ignore[no-untyped-call]
                sampling_rate=self.sample_rate,
                frame_size=self.frame_size,
                pad_to_multiple_of=self.frame_size,
            )
        self.feature_extractor = feature_extractor
        # As PocketTTSProcessor.decode builds it (its length from the feature extractor's rate).
        fade_samples = int(fade_in_s * feature_extractor.sampling_rate)
        self.fade_in = torch.linspace(0, 1, fade_samples).to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> float32 audio ``[B, T * frame_size]``: the tokenizer's decode
        of the latents, each row's first samples faded in (``PocketTTSProcessor.decode``)."""
        self.check_codes(codes)
        batch, _, frames = codes.shape
        if frames == 0:
            return torch.zeros(batch, 0, device=self.device)
        latents = codes_to_latents(codes.to(self.device)).transpose(1, 2)  # [B, T, K]
        audio = self.model.decode(latents).audio_values[:, 0, : frames * self.frame_size].float()
        fade = self.fade_in[: audio.shape[-1]]
        audio[:, : fade.numel()] *= fade
        return audio

    @torch.inference_mode()
    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """A voice prompt (float32 mono at :attr:`sample_rate`) -> codes ``[K, frames]``, as
        ``PocketTTSProcessor`` encodes one clip (see the module docstring)."""
        if audio.ndim != 1 or not audio.size:
            raise CodecError("prompt audio must be a non-empty mono array")
        if self.model.encoder is None:
            raise CodecError("this Pocket TTS audio tokenizer has no encoder")
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        inputs = self.feature_extractor(samples, sampling_rate=self.sample_rate)
        encoded = self.model.encode(
            inputs["input_values"].to(self.device, torch.float32),
            inputs["padding_mask"].to(self.device),
        )
        latents = encoded.latents[0][encoded.latents_mask[0].bool()]  # [frames, K]
        return latents_to_codes(latents).T.contiguous()

    def streaming_decoder(
        self, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> PocketLatentStreamingDecoder:
        from cadenza.codecs.pocket_latent_streaming import PocketLatentStreamingDecoder

        if compute_dtype not in self.streaming_dtypes:
            raise CodecError(
                f"the Pocket TTS audio tokenizer streams in float32 or bfloat16, not "
                f"{compute_dtype}"
            )
        return PocketLatentStreamingDecoder(self, max_streams, compute_dtype)

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raise :class:`CodecError` unless ``codes`` is an integer ``[batch, latent_dim,
        frames]`` tensor of float32 bit patterns of finite values."""
        if codes.dim() != 3 or codes.shape[1] != self.num_codebooks:
            raise CodecError(
                f"codes must be [batch, {self.num_codebooks}, frames], got {tuple(codes.shape)}"
            )
        if not torch.isfinite(codes_to_latents(codes)).all():
            raise CodecError("codes must be bit patterns of finite float32 values (no NaN, inf)")


# -- loading --------------------------------------------------------------------------------


def is_pocket_audio_tokenizer_directory(directory: Path) -> bool:
    """Whether ``directory`` holds a Pocket TTS audio tokenizer (its config's ``model_type``)."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def load_pocket_audio_tokenizer(
    name_or_path: str, device: str | torch.device = "cpu", seed: int = 0
) -> PocketLatentCodec:
    """The codec of a Hugging Face Pocket TTS audio tokenizer directory, in float32 on
    ``device``. Its ``preprocessor_config.json``, where that is a ``PocketTTSFeatureExtractor``'s,
    configures the voice prompt's feature extractor (else that class's defaults at the
    tokenizer's frame size). ``seed`` is accepted for the registry's uniform signature; a
    checkpoint carries all its weights. Raises :class:`CodecError` for anything else."""
    del seed
    directory = Path(name_or_path)
    if not is_pocket_audio_tokenizer_directory(directory):
        raise CodecError(f"{directory}: no config.json of model_type {MODEL_TYPE!r}")
    model = load_strictly(
        PocketTTSAudioTokenizerModel, directory, "Pocket TTS audio tokenizer", dtype=torch.float32
    )
    fold_weight_norm(model)
    model.to(torch.device(device), torch.float32)
    return PocketLatentCodec(model, _feature_extractor(directory))


def _feature_extractor(directory: Path) -> PocketTTSFeatureExtractor | None:
    """The directory's own ``PocketTTSFeatureExtractor``, if its preprocessor config is one
    (``transformers`` pairs a bare tokenizer with an EnCodec feature extractor, which knows
    nothing of ending on a pause)."""
    try:
        config = json.loads((directory / "preprocessor_config.json").read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(config, dict)
        or config.get("feature_extractor_type") != "PocketTTSFeatureExtractor"
    ):
        return None
    return PocketTTSFeatureExtractor.from_pretrained(directory)
