"""The host reads of an engine's decode steps, counted as a GPU would pay them: the runner's
part of each step (its launch and collect) under :class:`~cadenza.engine.device_audit.DeviceAudit`,
the torch path (no fused CPU step, whose kernels the audit cannot see)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.device_audit import DeviceAudit
from cadenza.engine.engine import Engine
from tests.support.float32_compute import float32_cpu_config

TOP_P = SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=2)  # the GPU's ranked draw


def checkpoint_step_reads(
    directory: Path,
    texts: Sequence[str],
    voice: str = "default",
    sampling: SamplingParams = TOP_P,
    **options: Any,
) -> dict[str, int]:
    """The host reads, by call, of four decode steps of a stream a text of the checkpoint in
    ``directory``, served in float32 on the torch path (``options``: more of
    ``Engine.from_pretrained``'s)."""
    engine = Engine.from_pretrained(
        str(directory), dtype="float32", cpu=float32_cpu_config(fused_decode=False), **options
    )
    requests = [
        SynthesisRequest(f"r{i}", text, voice, 2.0, sampling) for i, text in enumerate(texts)
    ]
    return dict(decode_step_audit(engine, requests, steps=4).reads)


def decode_step_audit(
    engine: Engine, requests: list[SynthesisRequest], steps: int = 4, warm: int = 2
) -> DeviceAudit:
    """What ``steps`` decode steps of ``requests`` ask of the device, counted after their
    prompts are prefilled and ``warm`` steps have met the masks they use. The requests are
    aborted afterwards and the engine's integrity checked."""
    for request in requests:
        engine.add_request(request)
    ids = [request.request_id for request in requests]

    def prefilling() -> bool:
        return any(getattr(engine.sequence(i), "is_prefilling", False) for i in ids)

    while prefilling():
        engine.step()
    for _ in range(warm):
        engine.step()
    audit = DeviceAudit()
    runner = engine.runner
    launch, collect = runner.launch, runner.collect

    def audited(call: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            with audit:
                return call(*args)

        return counted

    runner.launch, runner.collect = audited(launch), audited(collect)
    try:
        for _ in range(steps):
            assert not prefilling() and engine.has_unfinished_requests()
            engine.step()
    finally:
        del runner.launch, runner.collect  # the class's methods again
    for request_id in ids:
        engine.abort_request(request_id)
    engine.step()
    engine.check_integrity()
    return audit
