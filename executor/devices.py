"""Which device and backend a rank runs on, and what ``--device`` cannot do here (no torch import
at module level: the launcher checks before it starts anything).

``auto`` (the default) is CUDA with NCCL when this node has a GPU for every local rank, else the
CPU with gloo: the same scenario runs on a laptop and on a GPU node without a flag. ``cuda``
insists on GPUs and is refused before launch when there are too few; ``cpu`` forces gloo. The
parameter servers always run on the CPU with gloo (they talk point-to-point, as server
processes do), whatever the workers use.
"""

from __future__ import annotations

from simdist.errors import Problem

DEVICES = ("auto", "cpu", "cuda")


def choose(want: str, gpus: int, local_rank: int, local_ranks: int, cpu_only: bool = False) -> tuple[str, str]:
    """(device type, backend) for one rank: ``gpus`` is torch.cuda.device_count() on its node."""
    if cpu_only or want == "cpu":
        return "cpu", "gloo"
    if want == "cuda" or (gpus >= max(1, local_ranks) and local_rank < gpus):
        return "cuda", "nccl"
    return "cpu", "gloo"


def device_problems(want: str, local_ranks: int, gpus: int | None = None) -> list[Problem]:
    """Problems with ``--device`` for ``local_ranks`` ranks on this node (``gpus`` counted here,
    importing torch, only when CUDA is asked for)."""
    if want not in DEVICES:
        return [Problem("--device", f"{want!r} is not one of {', '.join(DEVICES)}")]
    if want != "cuda":
        return []
    if gpus is None:
        gpus = visible_gpus()
    if gpus < local_ranks:
        return [Problem("--device", f"cuda needs a GPU for each of the {local_ranks} local ranks, this machine has "
                        f"{gpus} (use --device auto or cpu)")]
    return []


def visible_gpus() -> int:
    """GPUs torch sees on this node (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
