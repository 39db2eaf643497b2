"""Host data onto the device without waiting for it.

On CUDA a copy from pageable host memory synchronises with the stream: it waits for every
forward already queued there, which would stall a host that schedules step N+1 while step N
runs. Staged through pinned memory, the copy is queued like a kernel instead (the pinned
buffer is held by torch's host allocator until the copy has run)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: as is on CPU, queued from pinned memory on CUDA."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


_NUMPY_TYPES = {torch.long: np.int64, torch.int32: np.int32, torch.float64: np.float64, torch.float32: np.float32}


def values_on_device(values: Sequence | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A flat list or an array of numbers as a tensor on `device` (see to_device). A list goes
    through numpy: `torch.tensor` on a list is 3-6x slower (6 us for 64 numbers, 490 us for
    6,000, a PRM batch's token ids)."""
    if not isinstance(values, np.ndarray):
        values = np.fromiter(values, dtype=_NUMPY_TYPES[dtype], count=len(values))
    host = torch.from_numpy(values).to(dtype)
    if not host.numel():  # numpy's empty results may have 0 strides, which a byte view (the wire) refuses
        host = torch.empty(host.shape, dtype=dtype)
    return to_device(host, device)
