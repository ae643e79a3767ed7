"""Turns a scheduled batch into one forward pass and returns the logits that will be sampled.

The batch is flattened: decode tokens first (one per sequence), then prefill chunks. The runner
builds the token rows, positions, cache slots and the :class:`AttentionContext`, runs the model,
and asks it for logits only at each sampling sequence's last token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.paged_kv_cache import PagedKVCache
from cadenza.engine.scheduler import ScheduledBatch
from cadenza.engine.sequence import Sequence
from cadenza.kernels.attention_context import AttentionContext, PrefillSpan, decode_key_slots


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [S, K, V] for the sampling sequences, in order
    sampling: list[Sequence]  # sequences whose last token was computed: they sample a row


class ModelRunner:
    def __init__(self, model: AudioTokenModel, kv_cache: PagedKVCache, device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> ForwardResult:
        rows: list[list[int]] = []
        positions: list[int] = []
        slots: list[int] = []
        sampling: list[Sequence] = []
        logits_indices: list[int] = []
        size = self.block_size

        decode_tables = np.full(
            (len(batch.decodes), max((len(s.block_table) for s in batch.decodes), default=0)),
            -1,
            dtype=np.int32,
        )
        decode_lens = np.zeros(len(batch.decodes), dtype=np.int32)
        for i, seq in enumerate(batch.decodes):
            position = seq.num_computed_tokens
            rows.append(seq.token_rows[position])
            positions.append(position)
            slots.append(seq.block_table[position // size] * size + position % size)
            decode_tables[i, : len(seq.block_table)] = seq.block_table
            decode_lens[i] = position + 1
            sampling.append(seq)
            logits_indices.append(i)

        spans = []
        for seq, num_new in batch.prefills:
            start = seq.num_computed_tokens
            query_start = len(rows)
            rows.extend(seq.token_rows[start : start + num_new])
            token_positions = np.arange(start, start + num_new)
            table = np.asarray(seq.block_table, dtype=np.int64)
            slots.extend((table[token_positions // size] * size + token_positions % size).tolist())
            positions.extend(token_positions.tolist())
            spans.append(
                PrefillSpan(
                    query_start=query_start,
                    query_len=num_new,
                    context_len=start + num_new,
                    block_table=torch.as_tensor(table, dtype=torch.int32, device=self.device),
                )
            )
            if start + num_new == seq.num_tokens:
                sampling.append(seq)
                logits_indices.append(len(rows) - 1)

        block_tables = torch.from_numpy(decode_tables).to(self.device)
        seq_lens = torch.from_numpy(decode_lens).to(self.device)
        key_slots, key_mask = decode_key_slots(block_tables, seq_lens, size)
        context = AttentionContext(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            num_decodes=len(batch.decodes),
            decode_block_tables=block_tables,
            decode_seq_lens=seq_lens,
            prefills=tuple(spans),
            decode_key_slots=key_slots,
            decode_key_mask=key_mask,
        )
        logits = self.model(
            torch.tensor(rows, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            context,
            self.kv_cache,
            torch.tensor(logits_indices, dtype=torch.long, device=self.device),
        )
        return ForwardResult(logits=logits, sampling=sampling)
