"""``cadenza bench pocket``: Kyutai Pocket TTS served by the engine, many streams at once,
against ``transformers``' ``PocketTTSForConditionalGeneration.generate`` serving one request
after another, same checkpoint, one run.

Model: a random checkpoint in the public layout (``config.json``, ``model.safetensors``,
``generation_config.json``, a tokenizer, the processor's files with its chat template, and the
audio tokenizer it names). ``shape="pocket"`` is the released model's size
(``PocketTTSConfig()``: a backbone of 6 layers at hidden 1024, 16 heads, MLP 4096; a flow head
of 6 blocks at width 512; latents of 32; the audio tokenizer as
``PocketTTSAudioTokenizerConfig()`` has it), ``"pocket-tiny"`` a smoke run. Weights fp32.
Linear weights are drawn at ``1 / sqrt(fan_in)`` and the flow head's output bias at
+-:data:`LATENT_OFFSET`, so the fed-back latents keep a steady direction and generation stays
finite for any length; the end-of-speech threshold is :data:`NEVER_ENDS`, so every stream makes
exactly ``frames`` frames on both sides. Both sides sample at the published temperature, 0.7,
with one flow step. Its tokenizer is a unigram vocabulary of 4,000 pieces, as the released
one: characters, and the most frequent English words whole (:func:`_vocab`), so a text takes
about as many prompt rows as it would in the released model (3.4 characters a row on the load
harness's texts), which is what prefill, and a wave of arrivals, cost.

Measured per batch size ``B``, ``frames`` frames (``frames / 12.5`` seconds of audio) a request:

* ``transformers``: ``B`` requests served one after another, each ``generate(do_sample=True,
  temperature=0.7, max_new_tokens=frames)`` on the processor's inputs, then
  ``PocketTTSAudioTokenizerModel.decode`` of its latents. Reported: frames per second of the
  generation alone and of generation plus decode, and the real-time factor of one request
  (seconds of audio per wall second, generation plus decode).
* the engine: ``B`` streams of the same text at once (seeded, temperature 0.7), the codec
  streaming their audio chunk by chunk within the steps. Reported: the median decode step
  (every stream advances one frame; a step that decodes a chunk includes the codec), the mean
  decode step and the codec's share of the decode steps' time (the steps' telemetry), frames
  per second over the batch (``B * frames`` over the whole run's wall time, prefill and codec
  included), one stream's real-time factor, ``engine_over_transformers`` (the engine's frames
  per second over ``transformers``' with decode), and ``engine_realtime``: whether the mean
  decode step fits in the frame period, 80 ms (every stream keeps up).
"""

from __future__ import annotations

import json
import math
import statistics
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.request import FinishReason, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

SHAPES: dict[str, dict[str, Any]] = {
    # PocketTTSConfig() and PocketTTSAudioTokenizerConfig() as they are: the released sizes.
    "pocket": {"model": {}, "flow_head": {}, "audio_tokenizer": {}},
    "pocket-tiny": {
        "model": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
        "flow_head": {"hidden_size": 32, "num_hidden_layers": 2, "frequency_embedding_size": 16},
        "audio_tokenizer": {
            "hidden_size": 16,
            "num_filters": 4,
            "num_hidden_layers": 1,
            "intermediate_size": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "upsample_groups": 16,
        },
    },
}
TEXT = "Pocket TTS reads one sentence aloud, and the benchmark times every frame of it."
TEMPERATURE = 0.7
FRAME_RATE = 12.5
PAGE_SIZE = 16
LATENT_OFFSET = 3.0
NEVER_ENDS = 1.0e9
"""The end-of-speech threshold: no logit of the random head comes near it."""
GENERATION: dict[str, Any] = {
    "do_sample": True,
    "temperature": TEMPERATURE,
    "num_flow_steps": 1,
    "eos_threshold": NEVER_ENDS,
    "min_frames_before_eos": 6,
    "return_dict_in_generate": True,
}

AUDIO_TOKENS: dict[str, str] = {
    "audio_prompt_token": "<|audio_prompt|>",
    "audio_latent_token": "<|audio_latent|>",
    "audio_prompt_bos_token": "<|audio_prompt_bos|>",
    "audio_bos_token": "<|audio_bos|>",
}
"""The tokenizer's named audio tokens, ids 4000-4003 in this order (the released ids)."""
TEXT_VOCAB = 4000
CAPITALIZED_WORDS = 300
CHAT_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'user' -%}\n"
    "{%- for content in message['content'] if content['type'] == 'audio' -%}\n"
    "{{- '<|audio_prompt_bos|><|audio_prompt|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- for content in message['content'] if content['type'] == 'text' -%}\n"
    "{%- set text = content['text'] | trim | replace('\\n', ' ') | replace('\\r', ' ')"
    " | replace('  ', ' ') -%}\n"
    "{{- text[0] | upper -}}{{- text[1:] -}}{{- '.' if text[-1].isalnum() else '' -}}\n"
    "{%- endfor -%}\n"
    "{{- '<|audio_bos|>' -}}\n"
    "{%- elif message['role'] == 'assistant' -%}\n"
    "{%- for content in message['content'] if content['type'] == 'audio' -%}\n"
    "{{- '<|audio_prompt|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
)
"""The processor's chat template. The user turn: the voice (``<|audio_prompt_bos|>`` and one
``<|audio_prompt|>``, which the processor expands to one placeholder per voice frame) when
the turn holds an audio item, then the text prepared as the original runtime prepares it
(stripped, line breaks and double spaces made single spaces, first character upper-cased, a
``.`` appended after a final letter or digit), then ``<|audio_bos|>``, the first audio
position. An assistant turn's audio (a training target) is one ``<|audio_prompt|>`` right
after that ``<|audio_bos|>``."""


def run(
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16),
    repeats: int = 3,
    progress: bool = False,
    shape: str = "pocket",
    frames: int = 50,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """The measurements of the module docstring. ``checkpoint``: a directory to write the
    benchmarked checkpoint into and keep (to serve and sweep the same model); by default it
    lives in a temporary directory for the run."""
    if frames < 2:
        raise ValueError("the engine's decode steps start at the second frame: frames >= 2")
    torch.manual_seed(0)
    reference, audio_tokenizer, processor = reference_pocket(shape)
    params = sum(p.numel() for p in reference.parameters())
    codec_params = sum(p.numel() for p in audio_tokenizer.parameters())
    config = reference.config
    model = {
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "latent_dim": config.latent_dim,
        "flow_head": {
            "hidden_size": config.flow_head_config.hidden_size,
            "num_hidden_layers": config.flow_head_config.num_hidden_layers,
        },
        "parameters": params,
        "audio_tokenizer_parameters": codec_params,
        "dtype": "float32",
    }
    inputs = _processor_inputs(processor)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = checkpoint or Path(scratch)
        _save(reference, audio_tokenizer, processor, directory)
        _time_transformers(reference, audio_tokenizer, inputs, 1, frames)  # warm up
        for batch in batch_sizes:
            runs = [
                _time_transformers(reference, audio_tokenizer, inputs, batch, frames)
                for _ in range(repeats)
            ]
            generate_s = statistics.median(generated for generated, _ in runs)
            total_s = statistics.median(generated + decoded for generated, decoded in runs)
            results.append(
                {
                    "batch": batch,
                    "transformers_frames_per_s": batch * frames / generate_s,
                    "transformers_with_decode_frames_per_s": batch * frames / total_s,
                    "transformers_realtime_factor": (frames / FRAME_RATE) / (total_s / batch),
                }
            )
        del reference, audio_tokenizer  # one copy of the weights in memory at a time
        engine = Engine.from_pretrained(
            str(directory),
            engine_config=_engine_config(
                config, max(batch_sizes), len(inputs["input_ids"][0]), frames
            ),
            cpu=CpuConfig(linear_dtype="float32"),
        )
        period_s = 1.0 / engine.frame_rate
        _time_engine(engine, max(batch_sizes), frames)  # warm up: first steps allocate
        for entry in results:
            batch = entry["batch"]
            measured = [_time_engine(engine, batch, frames) for _ in range(repeats)]
            wall_s = statistics.median(m["wall_s"] for m in measured)
            mean_step_s = statistics.median(m["mean_step_s"] for m in measured)
            entry["engine_decode_step_ms"] = 1000 * statistics.median(
                m["median_step_s"] for m in measured
            )
            entry["engine_mean_decode_step_ms"] = 1000 * mean_step_s
            entry["engine_codec_share"] = statistics.median(m["codec_share"] for m in measured)
            entry["engine_frames_per_s"] = batch * frames / wall_s
            entry["engine_realtime_factor"] = (frames / FRAME_RATE) / wall_s
            entry["engine_over_transformers"] = (
                entry["engine_frames_per_s"] / entry["transformers_with_decode_frames_per_s"]
            )
            entry["engine_realtime"] = mean_step_s <= period_s
            if progress:
                print(entry, flush=True)
    return {
        "benchmark": "pocket",
        "shape": shape,
        "model": model,
        "temperature": TEMPERATURE,
        "frames": frames,
        "audio_s_per_request": frames / FRAME_RATE,
        "threads": torch.get_num_threads(),
        "results": results,
    }


# -- the checkpoint -------------------------------------------------------------------------------


def reference_pocket(shape: str) -> tuple[Any, Any, Any]:
    """``(model, audio_tokenizer, processor)`` in ``shape``: ``transformers``' Pocket TTS with
    the released ids and frame rate, random weights (see the module docstring) and
    :data:`GENERATION`; its audio tokenizer, random; a processor with :func:`_tokenizer` and
    :data:`CHAT_TEMPLATE`. All in eval mode."""
    from transformers import (
        GenerationConfig,
        PocketTTSAudioTokenizerConfig,
        PocketTTSAudioTokenizerModel,
        PocketTTSConfig,
        PocketTTSFeatureExtractor,
        PocketTTSForConditionalGeneration,
        PocketTTSProcessor,
    )

    sizes = SHAPES[shape]
    defaults = PocketTTSConfig()
    flow_head = {
        **sizes["flow_head"],
        "condition_dim": sizes["model"].get("hidden_size", defaults.hidden_size),
    }
    config = PocketTTSConfig(flow_head_config=flow_head, **sizes["model"])
    config.architectures = ["PocketTTSForConditionalGeneration"]
    model: Any = PocketTTSForConditionalGeneration(config)
    _draw_weights(model, torch.Generator().manual_seed(1))
    model.generation_config = GenerationConfig(**GENERATION)  # type: ignore[no-untyped-call]
    codec_config = PocketTTSAudioTokenizerConfig(
        latent_dim=config.latent_dim, **sizes["audio_tokenizer"]
    )
    codec_config.architectures = ["PocketTTSAudioTokenizerModel"]
    audio_tokenizer: Any = PocketTTSAudioTokenizerModel(codec_config)
    processor = PocketTTSProcessor(
        feature_extractor=PocketTTSFeatureExtractor(),  # type: ignore[no-untyped-call]
        tokenizer=unigram_tokenizer(_vocab()),
        chat_template=CHAT_TEMPLATE,
    )
    return model.eval(), audio_tokenizer.eval(), processor


@torch.no_grad()
def _draw_weights(model: Any, generator: torch.Generator) -> None:
    """Linear weights of the backbone and the flow head at ``1 / sqrt(fan_in)``, the flow head's
    output bias at +-:data:`LATENT_OFFSET` (signs at random), token embeddings and the BOS
    latent unit normal, the latent statistics (mean from N(0, 0.5), std in [0.5, 1.5])."""
    for module in (model.model, model.flow_head):
        for name, parameter in module.named_parameters():
            if name.endswith("weight") and parameter.dim() == 2:
                std = 1.0 / math.sqrt(parameter.shape[1])
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    config = model.config
    embeddings = model.model.embed_tokens.weight
    embeddings.copy_(torch.randn(embeddings.shape, generator=generator))
    embeddings[config.pad_token_id] = 0.0
    signs = torch.randint(0, 2, (config.latent_dim,), generator=generator) * 2.0 - 1.0
    model.flow_head.final_layer.proj.bias.copy_(LATENT_OFFSET * signs)
    model.model.bos_latent.copy_(torch.randn(config.latent_dim, generator=generator))
    model.latent_mean.copy_(0.5 * torch.randn(config.latent_dim, generator=generator))
    model.latent_std.copy_(0.5 + torch.rand(config.latent_dim, generator=generator))


def _vocab() -> list[tuple[str, float]]:
    """:data:`TEXT_VOCAB` unigram pieces: ``<unk>``, ``<s>``, ``</s>``, ``<pad>``, the 256
    byte pieces, ``▁``, each printable character with and without ``▁``, then whole English
    words (:func:`_word_pieces`) in the rest: a text takes about as many rows as the released
    SentencePiece vocabulary of 4,000 pieces gives it (a common word one row, a rare one a row
    a character), not one a character, which would price a prompt's prefill several times
    over."""
    characters = string.ascii_letters + string.digits + string.punctuation
    vocab = [(piece, 0.0) for piece in ("<unk>", "<s>", "</s>", "<pad>")]
    vocab += [(f"<0x{byte:02X}>", 0.0) for byte in range(256)]
    vocab += [("▁", -3.0)]
    vocab += [("▁" + char, -5.0) for char in characters]
    vocab += [(char, -5.0) for char in characters]
    vocab += _word_pieces(TEXT_VOCAB - len(vocab), {piece for piece, _ in vocab})
    return vocab


def _word_pieces(slots: int, taken: set[str]) -> list[tuple[str, float]]:
    """``slots`` pieces ``▁word`` (not in ``taken``): the most frequent English words of
    ``wordfreq`` in order, the first :data:`CAPITALIZED_WORDS` also capitalized (a sentence's
    first word), scored by rank between -4 and -8 (a whole word beats its characters); unused
    pieces fill what a short word list leaves."""
    try:
        from wordfreq import top_n_list
    except ImportError as exc:
        raise RuntimeError(
            "the Pocket TTS benchmark's checkpoint takes its word pieces from wordfreq: "
            "pip install wordfreq (cadenza's dev extras have it)"
        ) from exc

    words = [word for word in top_n_list("en", 2 * slots) if word.isascii() and word.isalpha()]
    forms = [*words[:CAPITALIZED_WORDS], *(word.capitalize() for word in words[:CAPITALIZED_WORDS])]
    forms += words[CAPITALIZED_WORDS:]
    pieces = [piece for piece in dict.fromkeys("▁" + form for form in forms) if piece not in taken]
    pieces += [f"<unused_{index}>" for index in range(slots - len(pieces))]  # a short list
    return [(piece, -4.0 - 4.0 * rank / slots) for rank, piece in enumerate(pieces[:slots])]


def unigram_tokenizer(vocab: list[tuple[str, float]]) -> Any:
    """A SentencePiece-style tokenizer (a ``TokenizersBackend``) over ``vocab`` (pieces and
    scores in id order, ``<unk>`` first): ``▁`` prepended to every text, byte fallback (any
    text tokenizes), no BOS or EOS added, and the audio tokens of :data:`AUDIO_TOKENS` as
    special tokens right after ``vocab``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import TokenizersBackend

    backend = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="always", split=False
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in AUDIO_TOKENS.values()]
    )
    return TokenizersBackend(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens=dict(AUDIO_TOKENS),
    )


def _save(model: Any, audio_tokenizer: Any, processor: Any, directory: Path) -> None:
    """The checkpoint in the public layout, its audio tokenizer in ``audio_tokenizer/`` beside
    the model's files, named by ``processor_config.json``."""
    model.save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")
    codec = directory / "audio_tokenizer"
    audio_tokenizer.save_pretrained(codec)
    processor.save_pretrained(directory)
    path = directory / "processor_config.json"
    data = json.loads(path.read_text())
    data["audio_tokenizer"] = {
        "audio_tokenizer_class": "PocketTTSAudioTokenizerModel",
        "audio_tokenizer_name_or_path": str(codec.resolve()),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _processor_inputs(processor: Any) -> Any:
    """What the processor makes of :data:`TEXT` in a user turn: ``input_ids``,
    ``attention_mask``, ``frames_after_eos``."""
    conversation = [{"role": "user", "content": [{"type": "text", "text": TEXT}]}]
    prompt = processor.apply_chat_template(conversation, tokenize=False)
    return processor(text=prompt, return_tensors="pt")


def _engine_config(config: Any, streams: int, prompt_rows: int, frames: int) -> EngineConfig:
    """Twice the KV room of ``streams`` streams of ``prompt_rows`` and ``frames`` rows each
    (no stream waits for pages), every prompt prefilled in one step."""
    kv_width = config.num_key_value_heads * config.head_dim
    bytes_per_row = 2 * config.num_hidden_layers * kv_width * 4  # fp32 keys and values
    rows = 2 * streams * (prompt_rows + frames + PAGE_SIZE)
    return EngineConfig(
        page_size=PAGE_SIZE,
        max_num_seqs=streams,
        max_num_batched_tokens=max(256, streams * prompt_rows),
        enable_prefix_caching=False,
        kv_cache_memory_bytes=bytes_per_row * rows,
    )


# -- the timings ----------------------------------------------------------------------------------


def _time_transformers(
    model: Any, audio_tokenizer: Any, inputs: Any, batch: int, frames: int
) -> tuple[float, float]:
    """``(generation_s, decode_s)`` of ``batch`` requests served one after another."""
    generate_s = decode_s = 0.0
    for _ in range(batch):
        started = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(
                **inputs, do_sample=True, temperature=TEMPERATURE, max_new_tokens=frames
            )
            generated = time.perf_counter()
            audio = audio_tokenizer.decode(output.audio_latents).audio_values
        decoded = time.perf_counter()
        generate_s += generated - started
        decode_s += decoded - generated
        made = int(output.audio_latents_mask.sum())
        if made != frames or not bool(torch.isfinite(audio).all()):
            raise RuntimeError(
                f"transformers made {made} frames, not {frames}, or non-finite audio"
            )
    return generate_s, decode_s


def _time_engine(engine: Engine, batch: int, frames: int) -> dict[str, float]:
    """``batch`` streams of ``frames`` frames at once: the whole run's wall time, the median and
    mean step in which every stream decodes one frame, and the codec's share of those steps."""
    samples_per_frame = round(engine.sample_rate / engine.frame_rate)
    samples: dict[str, int] = {}
    for i in range(batch):
        request_id = f"bench-{i}-{time.monotonic_ns()}"
        sampling = SamplingParams(temperature=TEMPERATURE, top_k=0, seed=i)
        engine.add_request(
            SynthesisRequest(request_id, TEXT, "default", frames / FRAME_RATE, sampling)
        )
        samples[request_id] = 0
    steps: list[float] = []
    codec_s = 0.0
    previous = engine.telemetry.last_step
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        step_started = time.perf_counter()
        outputs = engine.step()
        took = time.perf_counter() - step_started
        step = engine.telemetry.last_step
        if step is not None and step is not previous and step.tokens == step.decodes == batch:
            steps.append(took)
            codec_s += step.codec_s
        previous = step
        for output in outputs:
            if output.finish_reason not in (None, FinishReason.LENGTH):
                raise RuntimeError(
                    f"{output.request_id} ended {output.finish_reason}: {output.error}"
                )
            samples[output.request_id] += len(output.audio)
    wall_s = time.perf_counter() - started
    if any(count != frames * samples_per_frame for count in samples.values()):
        raise RuntimeError(f"the engine's streams made {samples}, not {frames} frames each")
    return {
        "wall_s": wall_s,
        "median_step_s": statistics.median(steps),
        "mean_step_s": statistics.fmean(steps),
        "codec_share": codec_s / sum(steps),
    }
