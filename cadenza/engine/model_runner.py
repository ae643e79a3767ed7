"""Runs a scheduled batch: one forward pass over the flattened step, then one sampled row per
sequence whose last token was computed.

The batch is flattened: decode tokens first (one per sequence), then prefill chunks. The runner
builds the token rows, positions, cache slots and the :class:`AttentionContext`, runs the model,
asks it for logits only at each sampling sequence's last token, and samples them in one batched
call. For a two-level model (:attr:`AudioTokenModel.depth`) that call samples each row's first
id; the depth decoder then runs for every sampling sequence in lockstep, one level at a time,
each level sampled (per sequence, from its own generator) before the next is computed.

A stateful model (:attr:`AudioTokenModel.keeps_stream_state`) gets each stream's state with
the step (made here, at the stream's first step, from its conditioning), and its logits pass
through the model's :meth:`~AudioTokenModel.process_logits` before they are sampled. A model
that samples its own rows (:attr:`AudioTokenModel.samples_rows`, continuous latents) gets what
its forward returned there instead of the sampler.

A step of decodes alone runs at fixed shapes where the KV cache has a pad page
(:mod:`cadenza.engine.static_decode`: batch sizes, static buffers, CUDA graphs where
``cuda_graphs`` and the device has them); the output heads then run on its real rows.

A bad request must fail alone: if the batched forward raises, each sequence is run by itself
and only the ones that raise fail; a sequence whose logits hold NaN fails; a sampler error fails
that step's samplers. The runner changes no sequence: it reports rows and failures in a
:class:`StepResult` that :meth:`Scheduler.postprocess` applies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from cadenza.engine.device import available_memory_bytes
from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.layouts.token_layout import TokenLayout
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.stream_state import StepStreams, StreamState
from cadenza.engine.repetition_state import RepetitionState
from cadenza.engine.sampler import sample_ids
from cadenza.engine.sampling_masks import SamplingMasks
from cadenza.engine.scheduler import ScheduledBatch, StepResult
from cadenza.engine.sequence import Sequence
from cadenza.engine.static_decode import DecodeForward, StaticDecodeStep, fixed_decode_width
from cadenza.kernels.attention_backends import attention_backend_for
from cadenza.kernels.attention_context import AttentionContext, PrefillSpan, decode_keys
from cadenza.kernels.dense_decode_kv import DenseDecodeKV
from cadenza.kernels.host_upload import upload

log = logging.getLogger(__name__)


NAN_LOGITS = 1  # the model's logits held NaN
NAN_DEPTH_LOGITS = 2  # a depth decoder's logits held NaN at some level


@dataclass
class LaunchedStep:
    """A step queued on the device (:meth:`ModelRunner.launch`): its batch, what is known
    already (failures, and the rows of a model that samples its own rows), and the ids not
    read yet: ``ids [S, K + 1]``, each sampling sequence's row and its NaN flag (a sum of
    :data:`NAN_LOGITS` and :data:`NAN_DEPTH_LOGITS`, 0 for a good row)."""

    batch: ScheduledBatch
    result: StepResult
    ids: torch.Tensor | None = None
    sampling: list[Sequence] = field(default_factory=list)


class ModelRunner:
    """Runs steps of ``model`` over ``kv_cache``. With a pad page in the cache, steps of at
    most ``max_num_seqs`` decodes alone run at fixed shapes (:attr:`static_decode`, page
    tables ``decode_width`` pages wide when given), captured as CUDA graphs on CUDA when
    ``cuda_graphs``."""

    def __init__(
        self,
        model: AudioTokenModel,
        kv_cache: PagedKVCache,
        *,
        max_num_seqs: int = 64,
        cuda_graphs: bool = False,
        decode_width: int | None = None,
    ) -> None:
        self.model = model
        self.layout: TokenLayout = model.layout
        self.kv_cache = kv_cache
        self.device = model.device
        self.page_size = kv_cache.page_size
        masks = self.layout.sampling_masks()
        self.masks = None if masks is None else SamplingMasks(masks, self.device)
        # On the CPU, decode attention reads a dense copy of the decoding sequences' keys,
        # kept between steps, instead of gathering their pages every layer of every step. The
        # copy may use as much memory as the paged cache itself, and at most a quarter of what
        # is free now (growing, it briefly holds its old and new tensors).
        # A model whose steps run fused (cadenza.kernels.fused_cpu_decode) reads the pages in
        # place: it needs neither the copy nor the gathered key positions.
        fused = model.fused_decode
        self.fused_decode = fused is not None and fused.supports_cache(kv_cache)
        self.repetition = RepetitionState(self.device)  # the streams' seen ids, on the device
        self.static_decode = self._static_decode(max_num_seqs, decode_width)
        # (A fixed-shape step reads the pages themselves: a dense copy would miss its tokens.)
        self.dense_kv: DenseDecodeKV | None = None
        if self.device.type == "cpu" and not self.fused_decode and self.static_decode is None:
            spec = kv_cache.spec
            self.dense_kv = DenseDecodeKV(
                spec.num_layers,
                spec.num_kv_heads,
                spec.head_dim,
                model.dtype,
                self.device,
                max_bytes=min(kv_cache.nbytes, available_memory_bytes(self.device) // 4),
            )
        self.graph_memory_bytes = 0
        if self.static_decode is not None and cuda_graphs and self.device.type == "cuda":
            self.graph_memory_bytes = self.capture_graphs()

    def capture_graphs(self) -> int:
        """Capture the fixed-shape decode steps as CUDA graphs; the memory they took. A
        capture that fails leaves the steps eager, said in the log (serving goes on, slower):
        0 then."""
        assert self.static_decode is not None, "graphs capture the fixed-shape decode step"
        try:
            return self.static_decode.capture()
        except Exception:
            log.exception("capturing the decode steps as CUDA graphs failed; they run eagerly")
            self.static_decode.forget_graphs()
            return 0

    def _static_decode(
        self, max_num_seqs: int, width: int | None = None
    ) -> StaticDecodeStep | None:
        """The fixed-shape decode step where the cache has a pad page and the model's decode
        forward can run at fixed shapes (no per-stream state, no fused CPU step); its page
        tables ``width`` pages wide (by default the model's longest context in the cache)."""
        cache, model = self.kv_cache, self.model
        if cache.pad_page is None or model.keeps_stream_state or self.fused_decode:
            return None
        forward: DecodeForward = model
        if model.restricted_outputs is not None or model.depth is not None:
            forward = model.hidden_states
        backend = attention_backend_for(self.device, model.dtype)
        return StaticDecodeStep(
            forward,
            cache,
            num_codebooks=self.layout.num_codebooks,
            max_batch=max_num_seqs,
            max_pages=width
            or fixed_decode_width(cache.num_pages, self.page_size, model.max_positions),
            gathers_keys=backend.name == "torch",
            device=self.device,
        )

    def run(self, batch: ScheduledBatch) -> StepResult:
        """Forward ``batch`` and sample; never raises for a single bad sequence."""
        return self.collect(self.launch(batch))

    def launch(self, batch: ScheduledBatch) -> LaunchedStep:
        """Queue ``batch``'s forward pass and sampling on the device without reading their
        ids back (:meth:`collect` does): on an accelerator the host is free until then (a
        depth decoder's levels included). A model that samples its own rows reads as it goes:
        its step is done at launch. Never raises for a single bad sequence."""
        result = StepResult()
        launched = LaunchedStep(batch, result)
        if batch.is_empty:
            return launched
        columns_of = self._restricted_masks(batch)
        logits, hidden, sampling = self._forward_isolated(batch, result, columns_of)
        if not sampling:
            return launched
        if self.model.keeps_stream_state:
            logits = self.model.process_logits(logits, [_state(seq) for seq in sampling])
        # A NaN anywhere makes the row's sum NaN (one fast reduction instead of a comparison
        # of every logit; a row holding both +inf and -inf also fails, as it should).
        nan_rows = torch.isnan(logits.flatten(1).sum(dim=1))
        if self.model.samples_rows:
            self._sample_as_read(logits, nan_rows, sampling, result)
        else:
            self._sample_with_flags(logits, hidden, nan_rows, sampling, columns_of, launched)
        return launched

    def collect(self, launched: LaunchedStep) -> StepResult:
        """The result of a :meth:`launch`: its ids read with their NaN flags (the step's one
        read of the device), rows for the good ones, failures for the others."""
        result, ids = launched.result, launched.ids
        if ids is None:
            return result
        try:
            read: list[list[int]] = ids.tolist()
        except Exception as exc:  # an error the device met while sampling, found at the read
            log.exception("sampling failed")
            result.failed += [(seq, _describe(exc)) for seq in launched.sampling]
            return result
        for seq, row in zip(launched.sampling, read, strict=True):
            if row[-1] & NAN_LOGITS:
                result.failed.append((seq, "RuntimeError: the model produced NaN logits"))
            elif row[-1] & NAN_DEPTH_LOGITS:
                result.failed.append((seq, "RuntimeError: the depth decoder produced NaN logits"))
            else:
                result.rows.append((seq, row[:-1]))
        return result

    def _sample_as_read(
        self,
        logits: torch.Tensor,
        nan_rows: torch.Tensor,
        sampling: list[Sequence],
        result: StepResult,
    ) -> None:
        """Rows of a model that samples its own rows (reading the device as it goes), into
        ``result``."""
        # The flags first, so the model's sampler runs on the good rows only.
        has_nan = nan_rows.tolist()
        keep = [i for i, bad in enumerate(has_nan) if not bad]
        result.failed += [
            (sampling[i], "RuntimeError: the model produced NaN logits")
            for i, bad in enumerate(has_nan)
            if bad
        ]
        seqs = [sampling[i] for i in keep]
        if not seqs:
            return
        try:
            rows = self.model.sample_rows(logits[keep], seqs)
        except Exception as exc:  # a sampler failure fails this step's samplers only
            log.exception("sampling failed")
            result.failed += [(seq, _describe(exc)) for seq in seqs]
            return
        result.rows = list(zip(seqs, rows, strict=True))

    def _sample_with_flags(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        nan_rows: torch.Tensor,
        sampling: list[Sequence],
        columns_of: tuple[int, ...] | None,
        launched: LaunchedStep,
    ) -> None:
        """Sample every row, NaN ones too (the sampler keeps their ids in range), into
        ``launched.ids`` beside the NaN flags, for :meth:`collect` to read at once; a
        two-level model's rows through its depth decoder, level by level on the device."""
        constraints = [self.layout.constraints(seq) for seq in sampling]
        columns = None if columns_of is None else self.restricted_columns(columns_of)
        flags = nan_rows.long() * NAN_LOGITS
        try:
            if self.model.depth is None:
                ids = sample_ids(
                    logits,
                    sampling,
                    self.masks,
                    constraints,
                    columns=columns,
                    repetition=self.repetition,
                )
            else:
                assert hidden is not None, "a two-level model's forward gives hidden states"
                ids, nan_depth = self._sample_two_levels(logits, hidden, sampling, constraints)
                flags = flags + nan_depth.long() * NAN_DEPTH_LOGITS
        except Exception as exc:  # a sampler failure fails this step's samplers only
            log.exception("sampling failed")
            has_nan = nan_rows.tolist()  # (a failed step's read: say which held NaN)
            launched.result.failed += [
                (seq, "RuntimeError: the model produced NaN logits" if bad else _describe(exc))
                for seq, bad in zip(sampling, has_nan, strict=True)
            ]
            return
        launched.ids = torch.cat([ids, flags.view(-1, 1)], dim=1)
        launched.sampling = sampling

    def retain(self, running: list[Sequence]) -> None:
        """Forget what the runner keeps for sequences that are no longer ``running`` (their
        rows of the dense decode copy, of the seen-id table). The engine calls it after every
        step and abort."""
        self.repetition.retain(running)
        if self.dense_kv is not None:
            self.dense_kv.retain(running)

    def check_integrity(self, running: list[Sequence]) -> None:
        """Assert the runner keeps nothing for a sequence that is not ``running``."""
        assert set(self.repetition.owners()) <= set(running), "seen-id rows leaked"
        if self.dense_kv is not None:
            assert set(self.dense_kv.owners()) <= set(running), "dense decode rows leaked"

    @torch.inference_mode()
    def _sample_two_levels(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        seqs: list[Sequence],
        constraints: list[tuple[int, list[int | None] | None]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[S, K]`` of a two-level model, on the device: the first id from the
        backbone's ``logits [S, 1, V]``, the others from the depth decoder, level by level;
        and per sequence whether its depth logits held NaN at some level (its row then means
        nothing). Nothing is read back."""
        depth = self.model.depth
        assert depth is not None
        masks = self.masks

        def level_masks(level: int) -> SamplingMasks | None:
            return None if masks is None else masks.codebooks(level, 1)

        def forced_at(level: int) -> list[tuple[int, list[int | None] | None]]:
            return [(m, None if f is None else [f[level]]) for m, f in constraints]

        def sample(level_logits: torch.Tensor, level: int) -> torch.Tensor:
            return sample_ids(
                level_logits,
                seqs,
                level_masks(level),
                forced_at(level),
                level,
                repetition=self.repetition,
            )[:, 0]

        ids = sample(logits, 0)
        columns = [ids]
        loop = depth.begin(hidden, ids)
        level_logits = loop.logits
        nan = torch.zeros(len(seqs), dtype=torch.bool, device=level_logits.device)
        for level in range(1, depth.num_levels + 1):
            nan |= torch.isnan(level_logits).any(dim=-1)
            ids = sample(level_logits[:, None, :], level)
            columns.append(ids)
            if level < depth.num_levels:
                level_logits = loop.advance(ids)
        return torch.stack(columns, dim=1), nan

    def _restricted_masks(self, batch: ScheduledBatch) -> tuple[int, ...] | None:
        """The masks the batch's rows are at, when the model's heads are restricted (their
        logits then cover these masks' ids: :meth:`restricted_columns`); else ``None``."""
        restricted = self.model.restricted_outputs
        if restricted is None:
            return None
        seqs = [*batch.decodes, *(seq for seq, _ in batch.prefills)]
        return restricted.step_masks({self.layout.constraints(seq)[0] for seq in seqs})

    def restricted_columns(self, masks: tuple[int, ...]) -> torch.Tensor:
        """The ids a restricted step's logits are over (see :meth:`forward`)."""
        restricted = self.model.restricted_outputs
        assert restricted is not None
        return restricted.columns(masks)

    def _forward_isolated(
        self, batch: ScheduledBatch, result: StepResult, masks: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[Sequence]]:
        """Logits (and a two-level model's hidden states) of the batch's samplers; on failure,
        each sequence alone (failures go to ``result``)."""
        try:
            return self.forward(batch, masks)
        except Exception:
            log.exception("batched forward failed; retrying each sequence alone")
        if self.dense_kv is not None:  # its rows may hold some layers' new tokens, not all
            self.dense_kv.release(batch.decodes)
        logits, hiddens, sampling = [], [], []
        for seq, num_new in batch.items():
            alone = ScheduledBatch()
            if seq in batch.decodes:
                alone.decodes.append(seq)
            else:
                alone.prefills.append((seq, num_new))
            try:
                seq_logits, seq_hidden, seq_sampling = self.forward(alone, masks)
            except Exception as exc:
                log.error("request %s failed: %s", seq.request_id, exc)
                result.failed.append((seq, _describe(exc)))
                continue
            logits.append(seq_logits)
            if seq_hidden is not None:
                hiddens.append(seq_hidden)
            sampling.extend(seq_sampling)
        if not logits:
            return torch.empty(0), None, []
        return torch.cat(logits), torch.cat(hiddens) if hiddens else None, sampling

    @torch.inference_mode()
    def forward(
        self, batch: ScheduledBatch, masks: tuple[int, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[Sequence]]:
        """``logits [S, K, V]`` for the sequences whose last token this step computes (they
        sample a row), a two-level model's hidden states ``[S, H]`` there (``None`` for
        others), and those sequences, in order. With ``masks`` (a model with restricted heads:
        :meth:`_restricted_masks`), ``logits [S, 1, C]`` over :meth:`restricted_columns`."""
        static = self.static_decode
        if static is not None and not batch.prefills and static.takes(len(batch.decodes)):
            reads_hidden = static.forward is not self.model
            if reads_hidden == self._reads_hidden(masks):
                return self._heads(static.run(batch.decodes), list(batch.decodes), masks)
        rows: list[list[int]] = []
        positions: list[int] = []
        slots: list[int] = []
        sampling: list[Sequence] = []
        logits_indices: list[int] = []
        size = self.page_size

        decode_tables = np.full(
            (len(batch.decodes), max((len(s.page_table) for s in batch.decodes), default=0)),
            -1,
            dtype=np.int32,
        )
        decode_lens = np.zeros(len(batch.decodes), dtype=np.int32)
        for i, seq in enumerate(batch.decodes):
            position = seq.num_computed_tokens
            rows.append(seq.token_rows[position])
            positions.append(position)
            slots.append(seq.page_table[position // size] * size + position % size)
            decode_tables[i, : len(seq.page_table)] = seq.page_table
            decode_lens[i] = position + 1
            sampling.append(seq)
            logits_indices.append(i)

        spans = []
        for seq, num_new in batch.prefills:
            start = seq.num_computed_tokens
            query_start = len(rows)
            rows.extend(seq.token_rows[start : start + num_new])
            token_positions = np.arange(start, start + num_new)
            table = np.asarray(seq.page_table, dtype=np.int64)
            slots.extend((table[token_positions // size] * size + token_positions % size).tolist())
            positions.extend(token_positions.tolist())
            spans.append(
                PrefillSpan(
                    query_start=query_start,
                    query_len=num_new,
                    context_len=start + num_new,
                    page_table=upload(table, torch.int32, self.device),
                )
            )
            if start + num_new == seq.num_tokens:
                sampling.append(seq)
                logits_indices.append(len(rows) - 1)

        page_tables = upload(decode_tables, torch.int32, self.device)
        seq_lens = upload(decode_lens, torch.int32, self.device)
        dense = None
        if self.dense_kv is not None and batch.decodes:
            dense = self.dense_kv.plan(
                batch.decodes,
                decode_tables,
                decode_lens,
                np.array([_final_context(seq) for seq in batch.decodes]),
                size,
                invalidate=[seq for seq, _ in batch.prefills],
            )
        keys = None
        if dense is None and not self.fused_decode:
            longest = int(decode_lens.max()) if len(decode_lens) else 0
            keys = decode_keys(
                page_tables, seq_lens, size, self.kv_cache.spec.num_kv_heads, max_len=longest
            )
        context = AttentionContext(
            slot_mapping=upload(slots, torch.int64, self.device),
            num_decodes=len(batch.decodes),
            decode_page_tables=page_tables,
            decode_seq_lens=seq_lens,
            prefills=tuple(spans),
            decode_keys=keys,
            dense_decode=dense,
            every_slot_set=min(slots, default=0) >= 0,  # known here: no read of the device's copy
        )
        inputs = (
            upload(rows, torch.long, self.device),
            upload(positions, torch.long, self.device),
            context,
            self.kv_cache,
            upload(logits_indices, torch.long, self.device),
        )
        if self.model.keeps_stream_state:
            streams = self._streams(batch)
            return self.model(*inputs, streams=streams), None, sampling
        if self._reads_hidden(masks):
            return self._heads(self.model.hidden_states(*inputs), sampling, masks)
        return self._heads(self.model(*inputs), sampling, masks)

    def _reads_hidden(self, masks: tuple[int, ...] | None) -> bool:
        """Whether a step's heads start from the hidden states (restricted heads over
        ``masks``, a depth decoder) rather than the model's logits."""
        restricted = self.model.restricted_outputs is not None and masks is not None
        return restricted or self.model.depth is not None

    def _heads(
        self, out: torch.Tensor, sampling: list[Sequence], masks: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[Sequence]]:
        """What :meth:`forward` returns, from the model's output at ``sampling``'s tokens:
        hidden states (:meth:`_reads_hidden`) through the restricted heads or the first
        codebook's head, else the logits as they are."""
        if not self._reads_hidden(masks):
            return out, None, sampling
        restricted = self.model.restricted_outputs
        if restricted is not None and masks is not None:
            row_masks = [self.layout.constraints(seq)[0] for seq in sampling]
            return restricted.logits(out, row_masks, masks), None, sampling
        return self.model.first_logits(out), out, sampling

    def _streams(self, batch: ScheduledBatch) -> StepStreams:
        """The states of ``batch``'s streams in its token order, each made the first time its
        stream runs (a failure fails that stream: the batch is then retried one by one)."""
        seqs = [*batch.decodes, *(seq for seq, _ in batch.prefills)]
        for seq in seqs:
            if seq.model_state is None:
                if seq.conditioning is None:
                    raise ValueError(
                        f"{seq.request_id}: a stateful model needs a conditioned stream"
                    )
                seq.model_state = self.model.begin_stream(seq.conditioning)
        counts = [1] * len(batch.decodes) + [num_new for _, num_new in batch.prefills]
        return StepStreams(tuple(_state(seq) for seq in seqs), tuple(counts))


def _state(seq: Sequence) -> StreamState:
    assert seq.model_state is not None, "a stream's state is made before its first forward"
    return seq.model_state


def _final_context(seq: Sequence) -> int:
    """The most positions ``seq`` will ever cache: its rows so far and every step left."""
    final = seq.num_tokens + max(seq.max_new_steps - seq.num_generated, 0)
    return final if seq.max_context is None else min(final, seq.max_context)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
