"""``cadenza-tiny``: the default model, a small Llama-backbone codec LM built from a fixed seed.

Layout ``parallel+delay``: every sequence position holds a *row* of ``K = 8`` ids, one per
EnCodec codebook; a row's embedding is the sum of its ``K`` codebook embeddings, and one step
predicts ``K`` ids through ``K`` heads (fused into one matrix). Text is a byte-level prefix:
a text token sits in column 0 (ids offset past the audio vocabulary) with pad elsewhere.

Per-codebook audio vocabulary: codes ``0 .. codebook_size-1``, then ``pad_id`` (delay padding and
the begin-of-audio row) and ``eos_id`` (end of utterance, meaningful on codebook 0).

The weights are random (Hugging Face's initialisation, seeded): the model exercises every
serving path at the cost of a real one, and its audio is not speech. The EOS rows of the heads
are zero, so a random model's EOS logit sits mid-distribution: greedy and top-k (k <= 250)
sampling never pick it, and an utterance ends at the length derived from its text.

Sizing. The target is 20 concurrent real-time streams on a 2-core CPU: 1,500 frames a second.
Per frame EnCodec's decode costs ~40 MFLOP (~3 GFLOP per audio-second), the backbone ~12.6
(6.3 M parameters x 2), the heads ~4.2 (8 x 1026 x 256 parameters x 2): about 60 GFLOP/s for the
codec and 25 for the model, against the ~100-300 GFLOP/s two cores reach on batched products
(much less on small ones). So the backbone stays well under the codec's cost: hidden 256, 8
layers, 4 query / 2 KV heads of width 64, SwiGLU 768 (6.3 M backbone and 2.1 M head parameters,
10.6 M with embeddings; 8 KiB of fp32 KV per token). docs/benchmarks.md has where the time goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.layouts.delay_pattern import DelayPattern, DelayPatternLayout
from cadenza.engine.models.byte_tokenizer import ByteTokenizer
from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig
from cadenza.engine.models.model import AudioTokenModel
from cadenza.kernels.attention_context import AttentionContext

MODEL_NAME = "cadenza-tiny"


@dataclass(frozen=True)
class CadenzaTinySpec:
    backbone: LlamaBackboneConfig = field(
        default_factory=lambda: LlamaBackboneConfig(
            hidden_size=256,
            num_layers=8,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            intermediate_size=768,
        )
    )
    num_codebooks: int = 8
    codebook_size: int = 1024
    text_vocab_size: int = ByteTokenizer().vocab_size
    codec_name: str = "encodec_24khz"
    voices: tuple[str, ...] = ("default",)
    init_std: float = 0.02

    @property
    def pad_id(self) -> int:
        return self.codebook_size

    @property
    def eos_id(self) -> int:
        return self.codebook_size + 1

    @property
    def audio_vocab_size(self) -> int:
        return self.codebook_size + 2

    @property
    def delay_pattern(self) -> DelayPattern:
        return DelayPattern(self.num_codebooks, self.pad_id)


class CadenzaTinyModel(AudioTokenModel):
    """Rows of ``K`` ids in, logits ``[S, K, audio_vocab]`` out."""

    linears_giving_logits = ("heads",)

    def __init__(self, spec: CadenzaTinySpec) -> None:
        super().__init__()
        self.spec = spec
        self.layout = DelayPatternLayout(
            spec.num_codebooks, spec.codebook_size, spec.pad_id, spec.eos_id
        )
        self.kv_spec = spec.backbone.kv_spec
        self.vocab_size = spec.audio_vocab_size
        self.voices = spec.voices
        self.codec_name = spec.codec_name
        self.tokenizer = ByteTokenizer()
        d = spec.backbone.hidden_size
        vocab = spec.audio_vocab_size
        self.embed_codebooks = nn.ModuleList(
            nn.Embedding(vocab + (spec.text_vocab_size if k == 0 else 0), d)
            for k in range(spec.num_codebooks)
        )
        self.backbone = LlamaBackbone(spec.backbone)
        self.heads = nn.Linear(d, spec.num_codebooks * vocab, bias=False)

    @classmethod
    def from_seed(cls, seed: int, spec: CadenzaTinySpec | None = None) -> CadenzaTinyModel:
        """Build the model with deterministic random weights (same seed, same weights)."""
        spec = spec or CadenzaTinySpec()
        model = cls(spec)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, spec.init_std, generator=generator)
            heads = model.heads.weight.view(spec.num_codebooks, spec.audio_vocab_size, -1)
            heads[:, spec.eos_id].zero_()
        return model.eval()

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """The speech prompt's frames (one row of codes each), then the text bytes in column 0
        (pad elsewhere), then the begin-of-audio row (all pad)."""
        spec = self.spec
        pad_row = [spec.pad_id] * spec.num_codebooks
        rows = [[spec.audio_vocab_size + t, *pad_row[1:]] for t in self.tokenizer.encode(text)]
        return [*(list(frame) for frame in prompt_codes or []), *rows, pad_row]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        num_codebooks = input_ids.shape[1]
        assert num_codebooks == self.spec.num_codebooks, input_ids.shape
        embeddings = self.embed_codebooks[0](input_ids[:, 0])
        for k in range(1, num_codebooks):
            embeddings = embeddings + self.embed_codebooks[k](input_ids[:, k])
        hidden = self.backbone(embeddings, positions, context, kv_cache)
        logits = self.heads(hidden[logits_indices])
        return logits.view(-1, num_codebooks, self.spec.audio_vocab_size)
