"""The baseline: serve each stream the way simple servers do (``cadenza serve --engine naive``).

One Python thread per request runs the ``transformers`` model (``LlamaModel`` with its own
``DynamicCache``) one step at a time, and decodes every chunk with the offline EnCodec decoder
(the chunk's frames alone, no streaming state). Nothing is shared between requests: no
batching, no paged cache, no admission beyond ``engine.max_pending_requests`` (every request is
started at once, as servers without a capacity model do). Sampling and the delay pattern are
cadenza-tiny's own, so the tokens a request gets have the same distribution as on the real
engine; only the serving differs.

It exists so the load-test harness can put cadenza's capacity next to the naive way's on the
same machine, behind the same edge. It serves one model, the registry's
``NAIVE_BASELINE_MODEL`` (the built-in ``cadenza-tiny``).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import numpy as np
import torch

from cadenza.codecs import load_codec
from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import EngineStats, StepReport
from cadenza.contract.errors import RequestRejected
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.contract.stream_length import request_duration_s, stream_length
from cadenza.engine.chunk_policy import config_in_codec_frames
from cadenza.engine.identity import prompt_overhead_tokens
from cadenza.engine.models.registry import (
    NAIVE_BASELINE_MODEL,
    NaiveBaselineModel,
    naive_baseline_model,
)
from cadenza.engine.realtime.plan import realtime_plan
from cadenza.engine.repetition_state import RepetitionState
from cadenza.engine.sampler import sample_rows
from cadenza.engine.sampling_masks import SamplingMasks
from cadenza.engine.sequence import Sequence
from cadenza.kernels.native import loader

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.005
_EMPTY = np.zeros(0, dtype=np.float32)


class NaiveEngineError(ValueError):
    """The naive engine cannot serve this model or request."""


class NaiveEngine:
    def __init__(
        self,
        baseline: NaiveBaselineModel,
        *,
        config: CadenzaConfig | None = None,
    ) -> None:
        from transformers import LlamaConfig, LlamaModel

        self.config = config or CadenzaConfig()
        self.baseline = baseline
        self.model = baseline.model
        self.model_name = NAIVE_BASELINE_MODEL
        self.layout = self.model.layout
        backbone = baseline.backbone.config
        hf_config = LlamaConfig(
            vocab_size=1,  # embeddings come from the codebook tables
            bos_token_id=None,
            eos_token_id=None,
            hidden_size=backbone.hidden_size,
            intermediate_size=backbone.intermediate_size,
            num_hidden_layers=backbone.num_layers,
            num_attention_heads=backbone.num_heads,
            num_key_value_heads=backbone.num_kv_heads,
            head_dim=backbone.head_dim,
            rms_norm_eps=backbone.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": backbone.rope_theta},
            max_position_embeddings=16384,
        )
        hf_model: Any = LlamaModel(hf_config)
        self.hf_model = hf_model.eval()
        missing, unexpected = self.hf_model.load_state_dict(
            baseline.backbone.state_dict(), strict=False
        )
        if unexpected or set(missing) != {"embed_tokens.weight"}:
            raise NaiveEngineError(f"backbone does not map onto LlamaModel: {missing, unexpected}")
        self.codec = load_codec(
            self.model.codec_name or "encodec_24khz", seed=self.config.model.seed
        )
        self.frames = config_in_codec_frames(
            self.config,
            self.codec.frame_rate,
            self.codec.lookahead_frames,
            self.layout.steps_per_frame,
        )
        masks = self.layout.sampling_masks()
        self._masks = None if masks is None else SamplingMasks(masks, "cpu")
        self._outputs: queue.Queue[StreamOutput] = queue.Queue()
        self._cancelled: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: CadenzaConfig) -> NaiveEngine:
        if config.model.name != NAIVE_BASELINE_MODEL:
            raise NaiveEngineError(f"the naive engine serves only {NAIVE_BASELINE_MODEL}")
        if config.model.torch_threads:
            torch.set_num_threads(config.model.torch_threads)
        engine = cls(naive_baseline_model(config.model.seed), config=config)
        engine.model_name = config.model.public_name
        return engine

    @property
    def sample_rate(self) -> int:
        return self.codec.sample_rate

    @property
    def frame_rate(self) -> float:
        return self.codec.frame_rate

    @property
    def voices(self) -> tuple[str, ...]:
        return self.model.voices

    @property
    def info(self) -> EngineInfo:
        shape = StreamShape(
            page_size=self.config.engine.page_size,
            steps_per_frame=self.layout.steps_per_frame,
            tail_steps=self.layout.tail_steps,
            prompt_overhead_tokens=prompt_overhead_tokens(self.model),
        )
        return EngineInfo(
            model_name=self.model_name,
            voices=self.voices,
            sample_rate=self.sample_rate,
            frame_rate=self.frame_rate,
            device="cpu",
            shape=shape,
            kv_pages_total=2**31 - 1,  # no page pool: memory is not accounted
            max_num_seqs=self.config.engine.max_pending_requests,
            realtime=realtime_plan(
                self.config.realtime,
                self.frames,
                self.layout,
                self.frame_rate,
                self.codec.lookahead_frames,
                shape.nominal_prompt_tokens,
            ),
            calibration=None,
            native_kernels=loader.report(),
        )

    # -- the engine loop's interface ------------------------------------------------------------

    def add_request(self, request: SynthesisRequest) -> None:
        if request.voice not in self.voices:
            raise RequestRejected(f"unknown voice {request.voice!r}; voices: {self.voices}")
        if request.prompt_audio:
            raise RequestRejected("the naive engine takes no speech prompts")
        if request.resume is not None:
            raise RequestRejected("the naive engine cannot resume a stream another engine began")
        with self._lock:
            if request.request_id in self._cancelled:
                raise RequestRejected(f"duplicate request id {request.request_id!r}")
            if len(self._cancelled) >= self.config.engine.max_pending_requests:
                raise RequestRejected("engine queue is full")
            cancelled = self._cancelled[request.request_id] = threading.Event()
        threading.Thread(
            target=self._serve, args=(request, cancelled), name="naive-request", daemon=True
        ).start()

    def abort_request(self, request_id: str) -> bool:
        with self._lock:
            event = self._cancelled.get(request_id)
        if event is None:
            return False
        event.set()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._cancelled) or not self._outputs.empty()

    def idle_s(self) -> float:
        """Never: :meth:`step` itself waits for the request threads."""
        return 0.0

    def step(self) -> list[StreamOutput]:
        """Whatever the request threads produced since the last call (waits briefly if none)."""
        outputs = []
        try:
            outputs.append(self._outputs.get(timeout=_IDLE_WAIT_S))
            while True:
                outputs.append(self._outputs.get_nowait())
        except queue.Empty:
            pass
        return outputs

    def stats(self) -> EngineStats:
        """Only the number of live requests means something here (no pages, no batches)."""
        running = len(self._cancelled)
        return EngineStats(
            num_running=running,
            num_waiting=0,
            max_num_seqs=max(running, 1),
            kv_pages_total=0,
            kv_pages_free=0,
            num_preemptions=0,
            prefix_hit_tokens=0,
            prefix_query_tokens=0,
            skipped_steps=0,
            step_correction=1.0,
        )

    def take_report(self) -> StepReport:
        """No batched steps, no playout clocks: nothing to report."""
        return StepReport()

    # -- one request, in its own thread ---------------------------------------------------------

    def _serve(self, request: SynthesisRequest, cancelled: threading.Event) -> None:
        try:
            reason = self._generate(request, cancelled)
            self._outputs.put(StreamOutput(request.request_id, _EMPTY, reason))
        except Exception as exc:
            log.exception("naive request %s failed", request.request_id)
            self._outputs.put(
                StreamOutput(
                    request.request_id, _EMPTY, FinishReason.ERROR, str(exc), error_code="internal"
                )
            )
        finally:
            with self._lock:
                self._cancelled.pop(request.request_id, None)

    @torch.inference_mode()
    def _generate(self, request: SynthesisRequest, cancelled: threading.Event) -> FinishReason:
        from transformers import DynamicCache

        duration_s = request_duration_s(request.text, request.max_duration_s, self.config.limits)
        length = stream_length(duration_s, self.frame_rate, self.layout)
        generator = torch.Generator().manual_seed(request.sampling.seed or 0)
        prompt = self.model.build_prompt(request.text, request.voice)
        seq = Sequence(
            request.request_id, prompt, request.sampling, generator, max_new_steps=length.steps
        )
        seq.target_frames = length.frames
        cache = DynamicCache()
        repetition = RepetitionState(torch.device("cpu"))  # this stream's seen ids
        rows = torch.tensor(prompt)
        frames_sent = 0
        while True:
            if cancelled.is_set():
                return FinishReason.CANCELLED
            out = self.hf_model(inputs_embeds=self._embed(rows)[None], cache=cache, use_cache=True)
            logits = self.baseline.heads(out.last_hidden_state[0, -1:]).view(
                1, self.layout.num_codebooks, -1
            )
            constraints = [self.layout.constraints(seq)]
            row = sample_rows(logits, [seq], self._masks, constraints, repetition=repetition)[0]
            seq.append(row)
            seq.end_frame, reason = self.layout.on_row(seq, row)
            if reason is None and seq.num_generated >= seq.max_new_steps:
                reason = FinishReason.LENGTH
            frames_sent = self._emit(seq, frames_sent, final=reason is not None)
            if reason is not None:
                return reason
            rows = torch.tensor([row])

    def _embed(self, rows: torch.Tensor) -> torch.Tensor:
        embed_codebooks = self.baseline.embed_codebooks
        embedding = embed_codebooks[0](rows[:, 0])
        for k in range(1, rows.shape[1]):
            embedding = embedding + embed_codebooks[k](rows[:, k])
        return embedding

    def _emit(self, seq: Sequence, frames_sent: int, final: bool) -> int:
        """Decode the next chunk offline once it is due; returns the frames sent so far."""
        complete = self.layout.frames_ready(seq)
        first = frames_sent == 0
        threshold = self.frames.first_chunk_frames if first else self.frames.chunk_frames
        if complete - frames_sent < threshold and not (final and complete > frames_sent):
            return frames_sent
        codes = self.layout.frame_codes(seq, frames_sent, complete)
        tensor = torch.tensor(codes, dtype=torch.long).T[None]  # [1, K, frames]
        audio = self.codec.decode(tensor)[0].clamp(-1.0, 1.0).numpy()
        self._outputs.put(StreamOutput(seq.request_id, audio, codes=np.array(codes, np.uint16)))
        return complete
