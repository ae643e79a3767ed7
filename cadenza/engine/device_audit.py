"""What a stretch of torch work asks of its device beyond arithmetic: host reads and launches.

A GPU runs a decode step at full speed only while the host never waits for it and launches few
kernels. Both are properties of the code, not of the device, so they are counted the same way
on any device (the CPU path's tests and ``benchmarks/gpu_check.py`` on a GPU):

* **Host reads**: torch calls that need a tensor's values on the host, each a device-to-host
  round trip on a GPU (the host stops until the device has caught up): ``item``, ``tolist``,
  ``numpy``, ``cpu``, a device tensor's ``to`` the CPU, conversions to a Python ``bool``,
  ``int``, ``float`` or index (an ``if`` on a tensor, ``int(seq_lens.max())``), and the calls
  whose result's size depends on values (``nonzero``, ``masked_select``, ``unique``, indexing
  by a boolean mask).
* **Blocking uploads**: tensors made from host values straight on a device
  (``torch.tensor(values, device=...)``, ``torch.as_tensor`` likewise). On a GPU the copy from
  pageable memory waits for the work queued on its stream, as a read does;
  :func:`~cadenza.kernels.host_upload.upload` copies from pinned memory without waiting and is
  not counted.
* **Launches**: the computing operators dispatched (every ATen operator but views and bare
  allocations), each one kernel launch or more on a GPU unless a CUDA graph replays them.

Kernels called through ``ctypes`` (the CPU's native kernels) are invisible to both: audit the
torch path a GPU runs (``cpu.fused_decode = false``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods and torch functions that hand a tensor's values to the host.
READING_CALLS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "nonzero",
        "masked_select",
        "unique",
        "unique_consecutive",
    }
)
# Torch functions that make a tensor from host values, on the device their ``device`` names.
UPLOADING_CALLS = frozenset({"tensor", "as_tensor"})
# Operators that launch nothing a step waits on: allocations, and the scalar read `item` makes
# (counted as a host read; views are told by the operator itself).
SILENT_OPERATORS = frozenset(
    {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "_local_scalar_dense"}
)


class DeviceAudit:
    """A context that counts the host reads, blocking uploads and launches of the torch work
    done inside it (this thread): ``reads``, ``uploads`` and ``launches`` by call name.
    Re-entrant in sequence, not nested: each ``with`` adds to the counts; :meth:`reset`
    clears them.

    ``device``: the device audited. On an accelerator, reads of host tensors (codes checked
    before they go up, audio already back) and tensors made on the host are not counted:
    they wait for nothing. On the CPU every tensor is the device's, so every read counts, as
    it would if those tensors lived on a GPU."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.reads: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self._modes: list[Any] = []

    @property
    def host_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def blocking_uploads(self) -> int:
        return sum(self.uploads.values())

    @property
    def launch_count(self) -> int:
        return sum(self.launches.values())

    def reset(self) -> None:
        self.reads.clear()
        self.uploads.clear()
        self.launches.clear()

    def __enter__(self) -> DeviceAudit:
        self._modes = [
            _ReadCounter(self.reads, self.uploads, self.device.type != "cpu"),
            _LaunchCounter(self.launches),
        ]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(kind, error, trace)
        self._modes = []


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", str(func))


class _ReadCounter(TorchFunctionMode):
    def __init__(self, reads: Counter[str], uploads: Counter[str], skip_host: bool) -> None:
        super().__init__()
        self.reads = reads
        self.uploads = uploads
        self.skip_host = skip_host  # an accelerator's audit: host tensors wait for nothing

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = _name(func)
        on_host = self.skip_host and _on_host(args)
        if name in READING_CALLS and not on_host:
            self.reads[name] += 1
        elif name == "__getitem__" and _masks(args[1:]) and not on_host:
            self.reads["mask_index"] += 1
        elif name == "to" and _to_host(args, kwargs):
            self.reads["to_host"] += 1
        elif name in UPLOADING_CALLS and self._uploads_to_device(kwargs):
            self.uploads[name] += 1
        return func(*args, **(kwargs or {}))

    def _uploads_to_device(self, kwargs: dict[str, Any] | None) -> bool:
        device = (kwargs or {}).get("device")
        if device is None:
            return False
        return not self.skip_host or torch.device(device).type != "cpu"


def _on_host(args: tuple[Any, ...]) -> bool:
    """Whether a call's tensor (its first argument) lives on the host."""
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"


def _masks(indices: tuple[Any, ...]) -> bool:
    """Whether an indexing key holds a boolean tensor (a result sized by its values)."""
    flat: list[Any] = []
    for index in indices:
        flat.extend(index if isinstance(index, tuple) else (index,))
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in flat)


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """Whether a ``Tensor.to`` call moves a device's tensor to the CPU (``args[0]`` the tensor;
    on the CPU, ``.to(device)`` is the upload a GPU's path makes, not a read)."""
    if not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    targets = [*args[1:], (kwargs or {}).get("device")]
    for target in targets:
        if isinstance(target, torch.device) and target.type == "cpu":
            return True
        if isinstance(target, str) and target.startswith("cpu"):
            return True
    return False


class _LaunchCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, launches: Counter[str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.launches = launches

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        base = func.overloadpacket.__name__
        if not func.is_view and base not in SILENT_OPERATORS:
            self.launches[base] += 1
        return func(*args, **(kwargs or {}))
