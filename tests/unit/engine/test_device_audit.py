"""The device audit counts what a GPU would wait on (host reads, blocking uploads) and what it
would launch, the same way on the CPU: each kind of read once, views and allocations not as
launches, and a decode step of the torch path (the one a GPU runs) counted per step."""

from __future__ import annotations

import torch

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.device_audit import DeviceAudit
from cadenza.engine.engine import Engine
from cadenza.kernels.host_upload import upload
from tests.support.float32_compute import float32_cpu_config


def test_every_kind_of_host_read_is_counted_once() -> None:
    values = torch.arange(6.0)
    flags = values > 2
    with DeviceAudit() as audit:
        values[1].item()
        values.tolist()
        bool(values[3] > 2)
        int(values[1])
        float(values[2])
        [0, 1, 2][torch.tensor(1)]
        values.nonzero()
        values[flags]
        values.to("cpu")  # a CPU tensor's: the upload idiom .to(device), not a read
        values.numpy()
        values.cpu()
    assert audit.reads == {
        "item": 1,
        "tolist": 1,
        "__bool__": 1,
        "__int__": 1,
        "__float__": 1,
        "__index__": 1,
        "nonzero": 1,
        "mask_index": 1,
        "numpy": 1,
        "cpu": 1,
    }
    assert audit.host_reads == 10


def test_tensors_made_from_host_values_on_a_named_device_are_blocking_uploads() -> None:
    cpu = torch.device("cpu")
    with DeviceAudit() as audit:
        torch.tensor([1, 2], device=cpu)
        torch.as_tensor([3.0], device="cpu")
        torch.tensor([4])  # on the host: nothing to wait for
        upload([5, 6], torch.long, cpu)  # pinned and without blocking on a GPU
        torch.arange(3, device=cpu)  # made on the device
    assert audit.uploads == {"tensor": 1, "as_tensor": 1} and audit.blocking_uploads == 2
    assert audit.host_reads == 0
    audit.reset()
    assert audit.blocking_uploads == 0


def test_an_accelerator_s_audit_leaves_out_host_tensors() -> None:
    # On a GPU, checking codes before they go up or audio already back waits for nothing.
    values = torch.arange(6.0)
    with DeviceAudit("cuda") as audit:
        values.tolist()
        bool(values[3] > 2)
        values[values > 2]
        torch.tensor([1], device="cpu")
    assert audit.host_reads == 0 and audit.blocking_uploads == 0
    with DeviceAudit("cpu") as audit:  # on the CPU every tensor is the device's
        values.tolist()
    assert audit.host_reads == 1


def test_launches_are_computing_operators_not_views_or_allocations() -> None:
    values = torch.arange(6.0)
    with DeviceAudit() as audit:
        (values * 2 + 1).view(2, 3).sum()
        torch.empty(4)
        values[1:3].reshape(2, 1)
    assert audit.launches == {"mul": 1, "add": 1, "sum": 1}
    assert audit.launch_count == 3 and audit.host_reads == 0


def test_counts_add_up_across_uses_and_reset_clears_them() -> None:
    audit = DeviceAudit()
    for _ in range(2):
        with audit:
            torch.ones(2).tolist()
    assert audit.reads == {"tolist": 2} and audit.host_reads == 2
    audit.reset()
    assert audit.host_reads == 0 and audit.launch_count == 0


def test_outside_the_context_nothing_is_counted() -> None:
    audit = DeviceAudit()
    with audit:
        pass
    torch.arange(3.0).tolist()
    assert audit.host_reads == 0 and audit.launch_count == 0


def test_a_decode_step_of_the_torch_path_is_audited_per_step() -> None:
    engine = Engine.from_pretrained(
        "cadenza-tiny",
        cpu=float32_cpu_config(fused_decode=False),
        device="cpu",
        seed=0,
        kv_cache_memory_bytes=32 << 20,
    )
    for index in range(4):
        engine.add_request(
            SynthesisRequest(f"s{index}", "audit this step", "default", 2.0, SamplingParams(seed=1))
        )
    while any(engine.sequence(f"s{i}").is_prefilling for i in range(4)):  # type: ignore[union-attr]
        engine.step()
    steps = 5
    with DeviceAudit() as audit:
        for _ in range(steps):
            engine.step()
    # Today's torch path: every layer's operators launched one by one, and the sampler and
    # the scheduler reading values back (docs/benchmarks.md, "The GPU step on paper").
    layers = engine.kv_cache.spec.num_layers
    assert audit.launch_count / steps > 10 * layers
    assert audit.host_reads / steps >= 1
    for request_id in ("s0", "s1", "s2", "s3"):
        engine.abort_request(request_id)
    engine.step()
    engine.check_integrity()
