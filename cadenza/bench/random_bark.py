"""A Bark checkpoint with random weights in the public ``transformers`` layout, for benchmarks
and tests (no weights can be downloaded here): ``model_type: "bark"`` with the published
vocabularies (semantic input 129,600 and output 10,048, coarse 12,096, fine 1,056 over 8
codebooks), a 24 kHz EnCodec with codebooks drawn at random (``transformers`` leaves them at
zero), ``generation_config.json`` with the published special ids and windows, a WordPiece
(BERT) tokenizer and voice presets listed in ``speaker_embeddings_path.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHAPES: dict[str, dict[str, Any]] = {
    # suno/bark-small: three stages of 12 layers at hidden 768, the real EnCodec's shape.
    "bark-small": {"stage": {"num_layers": 12, "num_heads": 12, "hidden_size": 768}, "codec": {}},
    "bark-tiny": {
        "stage": {"num_layers": 2, "num_heads": 2, "hidden_size": 32, "initializer_range": 0.2},
        "codec": {"hidden_size": 16, "num_filters": 4, "num_lstm_layers": 1},
    },
}
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and"]


def _bark_config(shape: str) -> Any:
    from transformers import BarkConfig, EncodecConfig

    spec = SHAPES[shape]
    common: dict[str, Any] = {"block_size": 1024, "dropout": 0.0, **spec["stage"]}
    return BarkConfig(
        semantic_config=dict(
            common, input_vocab_size=129_600, output_vocab_size=10_048, bias=False
        ),
        coarse_acoustics_config=dict(
            common, input_vocab_size=12_096, output_vocab_size=12_096, bias=True
        ),
        fine_acoustics_config=dict(
            common, input_vocab_size=1_056, output_vocab_size=1_056, bias=False, n_codes_total=8
        ),
        codec_config=EncodecConfig(**spec["codec"]).to_dict(),
    )


def save_bert_tokenizer(directory: Path) -> None:
    """A WordPiece tokenizer with BERT's special tokens at their ids and a few words."""
    from transformers import BertTokenizer

    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)]
    vocab += ["[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz.,!?"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    ids = {token: index for index, token in enumerate(dict.fromkeys(vocab))}
    BertTokenizer(vocab=ids, do_lower_case=False).save_pretrained(str(directory))


def save_voice(directory: Path, name: str, seed: int, frames: int, semantic: int) -> None:
    """A random voice preset of ``frames`` codec frames and ``semantic`` semantic tokens."""
    rng = np.random.default_rng(seed)
    arrays = {
        "semantic_prompt": rng.integers(0, 10_000, size=semantic),
        "coarse_prompt": rng.integers(0, 1024, size=(2, frames)),
        "fine_prompt": rng.integers(0, 1024, size=(8, frames)),
    }
    files = {}
    for key, array in arrays.items():
        relative = f"speaker_embeddings/{name}_{key}.npy"
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        np.save(directory / relative, array)
        files[key] = relative
    index_path = directory / "speaker_embeddings_path.json"
    # The published index names its repository first; readers put their own path there.
    index = json.loads(index_path.read_text()) if index_path.exists() else {"repo_or_path": "."}
    index[name] = files
    index_path.write_text(json.dumps(index))


def save_random_bark(
    directory: Path,
    shape: str = "bark-tiny",
    seed: int = 0,
    windows: dict[str, dict[str, int]] | None = None,
) -> Any:
    """Save a random Bark of ``shape`` (:data:`SHAPES`) with the voice ``v2/en_speaker_6``
    (450 frames) to ``directory``; the ``transformers`` ``BarkModel`` it saved. ``windows``:
    generation settings other than the published ones, by section (``coarse_acoustics_config``:
    ``max_coarse_history``, ...), which both sides then read from ``generation_config.json``."""
    from transformers import BarkModel, GenerationConfig
    from transformers.models.bark import generation_configuration_bark

    # transformers' generation configs are untyped.
    stages: Any = generation_configuration_bark
    plain: Any = GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = BarkModel(_bark_config(shape))
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buffer in model.codec_model.quantizer.named_buffers():
            if name.endswith("codebook.embed"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
    # BarkGenerationConfig cannot be saved; a plain one carrying the stages' sections is what
    # BarkModel.generate reads.
    changed = windows or {}
    model.generation_config = plain(
        semantic_config=stages.BarkSemanticGenerationConfig().to_diff_dict()
        | changed.get("semantic_config", {}),
        coarse_acoustics_config=stages.BarkCoarseGenerationConfig().to_diff_dict()
        | changed.get("coarse_acoustics_config", {}),
        fine_acoustics_config=stages.BarkFineGenerationConfig().to_diff_dict()
        | changed.get("fine_acoustics_config", {}),
        codebook_size=1024,
        sample_rate=24_000,
    )
    model.save_pretrained(str(directory))
    save_bert_tokenizer(directory)
    save_voice(directory, "v2/en_speaker_6", seed=seed + 1, frames=450, semantic=300)
    return model
