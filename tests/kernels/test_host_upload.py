"""Uploads: the values as a tensor of the dtype asked for (on the CPU, a plain tensor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.kernels.host_upload import upload

CPU = torch.device("cpu")


def test_lists_numbers_and_arrays_arrive_in_the_dtype_asked_for() -> None:
    assert upload([[1, 2], [3, 4]], torch.long, CPU).tolist() == [[1, 2], [3, 4]]
    assert upload([0.5, 2.0], torch.float32, CPU).dtype == torch.float32
    assert upload(np.arange(3, dtype=np.int32), torch.long, CPU).tolist() == [0, 1, 2]
    assert upload(7, torch.long, CPU).item() == 7
    mask = torch.tensor([True, False])
    assert upload(mask, torch.bool, CPU) is mask  # a host tensor already where it goes


def test_garbage_is_refused_by_torch() -> None:
    with pytest.raises((TypeError, ValueError)):
        upload([[1, 2], [3]], torch.long, CPU)
    with pytest.raises((TypeError, ValueError)):
        upload(["a"], torch.long, CPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_the_copy_does_not_block_and_arrives_whole() -> None:
    cuda = torch.device("cuda")
    values = list(range(1000))
    assert upload(values, torch.long, cuda).cpu().tolist() == values
