"""The native products' weight layout."""

from __future__ import annotations

import torch

from cadenza.kernels.packed_product import pack_weight


def test_weights_are_packed_in_blocks_of_sixteen_output_rows():
    weight = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4)
    packed = pack_weight(weight, torch.float32)
    assert packed.shape == (2, 4, 16)
    assert packed[1, 2, 5] == weight[16 + 5, 2]
    pairs = pack_weight(weight, torch.bfloat16, pairs=True)
    assert pairs.shape == (2, 2, 16, 2) and pairs.dtype == torch.bfloat16
    assert pairs[1, 1, 5, 1] == weight[16 + 5, 3]
