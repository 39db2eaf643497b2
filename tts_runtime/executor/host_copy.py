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


def values_on_device(values: Sequence | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A list or array of numbers as a tensor on `device` (see to_device)."""
    host = torch.from_numpy(values).to(dtype) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)
    return to_device(host, device)
