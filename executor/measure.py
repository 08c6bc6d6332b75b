"""What a run measures: model-state bytes, saved-activation bytes, collectives, phase times.

Model states are counted from the tensors this rank actually holds: the local shard of every
parameter (``DTensor.to_local()`` for tensor-parallel and FSDP2 parameters), its gradient, and
the optimizer's per-parameter states (Adam's ``exp_avg``/``exp_avg_sq``, SGD's momentum; the
0-d ``step`` counters are left out, as the ZeRO paper's accounting does).

Saved activations are counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor
autograd saves for backward passes the pack hook; parameters (and casts or views taken
straight from a parameter, e.g. autocast's bf16 weight copies) are not activations and are
skipped. Tensors are deduplicated by storage, and a storage is released when the last packed
reference to it is freed (autograd drops saved tensors after their backward), so the counter
tracks the bytes alive at every moment and reports the peak over a step, pipeline micro-batches
in flight included. The inputs that ``torch.utils.checkpoint`` keeps are routed through
:func:`executor.model.keep_for_backward` so that they are counted too; what a checkpointed
region saves while it is recomputed in backward goes to checkpoint's own hooks and is not
counted (simdist.analytic.memory adds one recomputed layer for it).

Collectives are counted with a ``TorchDispatchMode`` on one extra, instrumented step: every
c10d op (``c10d.allreduce_``, ``c10d._allgather_base_``, ``c10d.send``, ...) and functional
collective (``_c10d_functional.all_gather_into_tensor``, used by DTensor) goes through the
dispatcher, DDP's C++ reducer and FSDP2 included (dispatch modes are thread-local: on CUDA,
where autograd runs backward hooks on its device threads, DDP's bucket all-reduces may be
missed; on the CPU backward runs on the training thread). ``bytes`` is the size of the whole buffer
(the larger of input and output: all-gather counts its output, reduce-scatter its input; an
all-to-all what this rank sends), the ``size`` nccl-tests reports. On gloo FSDP2's reduce-scatter runs as a full all-reduce inside
the backend; it is still counted as the reduce_scatter the program issued.

Phase times of the measured steps use ``time.perf_counter`` (wall) and ``time.thread_time``
(CPU time of the training thread). On the CPU the training thread computes everything itself
(one thread a rank: OMP_NUM_THREADS=1, executor.torchrun.worker_env), so while it is not on a
core it is waiting: ``comm`` = wall - CPU time of the step is the exposed communication
(collective and pipeline waits, and on an oversubscribed host also the wait for a core), and
forward / backward / optimizer are the CPU times of those phases. Where Linux reports it
(:func:`executor.timeline.run_delay_s`), the wait for a core is measured apart (``core_wait``)
and ``comm`` is only the wait for peers.
``helper_threads`` is not a part of the step's wall time but the CPU time the process's other
threads used during it (``time.process_time`` less the training thread's): gloo's transport
threads and the process group's workers moving and reducing the collectives' data, CPU work that
competes for the cores when ranks outnumber them (simdist.analytic.timeshare).
Forward is timed with hooks on each model chunk (so a pipeline's
interleaved forwards are caught); in a pipeline, backward is the schedule's CPU time minus
forward. On CUDA, phases are wall times with a synchronize at each boundary and ``comm`` is not
measured (None).
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from executor.parallelize import ParallelModel
from executor.timeline import Spans, Tracer, run_delay_s
from executor.train import Probe

# --- model states ---------------------------------------------------------------------------


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; any other tensor as it is. (DTensor is looked up only if
    torch.distributed.tensor is already imported: without it no DTensor can exist.)"""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(t, dtensor.DTensor):
        return t.to_local()
    return t


def tensor_bytes(t: torch.Tensor) -> int:
    local = local_tensor(t)
    return local.numel() * local.element_size()


def _inner_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeroRedundancyOptimizer keeps this rank's partition in a local optimizer ``.optim``."""
    return getattr(opt, "optim", opt)


def model_state_bytes(pm: ParallelModel) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states this rank holds (local shards)."""
    params = pm.parameters()
    out = {"params": 0, "grads": 0, "optimizer": 0}
    with torch.no_grad():
        for p in params:
            out["params"] += tensor_bytes(p)
            if p.grad is not None:
                out["grads"] += tensor_bytes(p.grad)
        for state in _inner_optimizer(pm.optimizer).state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    out["optimizer"] += tensor_bytes(value)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


class GatheredParams:
    """Peak bytes of parameters gathered by FSDP2 (unsharded copies registered on the modules).

    FSDP2 swaps a module's registered parameters between the sharded DTensors (recorded here at
    construction) and the unsharded tensors it all-gathers; whatever is registered and not one of
    the sharded parameters is a gathered copy. Checked after every chunk forward: with
    reshard_after_forward=False (ZeRO-2) the whole stage stays gathered until the end of
    backward; with True (ZeRO-3) only the root module (embedding, head) does.
    """

    def __init__(self, pm: ParallelModel):
        self.pm = pm
        self.sharded = {id(p) for p in pm.parameters()} if pm.data_parallel == "fsdp" else None
        self.peak = 0

    def sample(self) -> None:
        if self.sharded is None:
            return
        seen: set[int] = set()
        total = 0
        for chunk in self.pm.chunks:
            for p in chunk.parameters():
                if id(p) not in self.sharded and id(p) not in seen:
                    seen.add(id(p))
                    total += tensor_bytes(p)
        self.peak = max(self.peak, total)


# --- saved activations ----------------------------------------------------------------------


def _from_parameter(t: torch.Tensor, depth: int = 3) -> bool:
    """True for a parameter, or a cast/view/DTensor wrapper taken directly from one."""
    if isinstance(t, nn.Parameter):
        return True
    fn = t.grad_fn
    for _ in range(depth):
        if fn is None:
            return False
        nexts = [f for f, _ in fn.next_functions if f is not None]
        if len(nexts) != 1:
            return False
        fn = nexts[0]
        variable = getattr(fn, "variable", None)  # AccumulateGrad holds its leaf
        if variable is not None:
            return isinstance(variable, nn.Parameter)
    return False


class _Saved:
    """What the pack hook stores: the tensor, plus a finaliser that releases its storage count."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedActivations:
    """Peak bytes of tensors saved for backward (see the module docstring)."""

    def __init__(self) -> None:
        self.alive: dict[int, list[int]] = {}  # storage ptr -> [refcount, bytes]
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.alive.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.alive[key]

    def _pack(self, t: torch.Tensor) -> Any:
        if _from_parameter(t):
            return t
        local = local_tensor(t)
        try:
            storage = local.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return t
        if nbytes == 0:
            return t
        entry = self.alive.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[0] += 1
        saved = _Saved(t)
        weakref.finalize(saved, self._release, key)
        return saved

    @staticmethod
    def _unpack(obj: Any) -> torch.Tensor:
        return obj.tensor if isinstance(obj, _Saved) else obj

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield


# --- collectives ----------------------------------------------------------------------------

_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("recv", "recv"),
    ("send", "send"),
    ("scatter", "scatter"),
    ("gather", "gather"),
    ("reduce", "reduce"),
)
_NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd", "monitored_barrier_")


def collective_kind(op_name: str) -> str | None:
    """all_reduce, all_gather, reduce_scatter, ... for a c10d op name; None for anything else."""
    namespace, _, rest = op_name.partition(".")
    if namespace not in ("c10d", "_c10d_functional", "c10d_functional"):
        return None
    name = rest.split(".")[0]
    if name in _NOT_COLLECTIVES:
        return None
    for needle, kind in _KINDS:
        if needle in name:
            return kind
    return name.strip("_")


def _tensor_list_bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return tensor_bytes(x)
    if isinstance(x, list | tuple):
        return sum(_tensor_list_bytes(v) for v in x)
    return 0


class CollectiveCensus(TorchDispatchMode):
    """Counts the collectives issued while active, with their bytes (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        kind = collective_kind(str(func))
        if kind is not None:
            sizes = [_tensor_list_bytes(a) for a in args] + [_tensor_list_bytes(out)]
            entry = self.counts[kind]
            entry["count"] += 1
            # an uneven all_to_all_single (the expert dispatch): what this rank sends, nccl-tests' size
            entry["bytes"] += sizes[1] if "alltoall_base" in str(func) else max(sizes)
        return out

    def result(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in sorted(self.counts.items())}


# --- phase timing ---------------------------------------------------------------------------


@dataclass
class StepTimes:
    wall: float = 0.0
    cpu: float = 0.0
    core_wait: float | None = None  # runnable but not running (schedstat run_delay)
    helper_threads: float = 0.0  # CPU time of the process's other threads (gloo's) meanwhile
    phases_wall: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    phases_cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class StepProbe(Probe):
    """Phase timers (and, on the instrumented step, the memory counters) for train_step."""

    def __init__(self, pm: ParallelModel, cuda: bool, tracer: Tracer | None = None):
        self.pm = pm
        self.cuda = cuda
        self.tracer = tracer or Tracer(None, 0, cuda)
        self.times = StepTimes()
        self.spans = Spans()
        self.saved: SavedActivations | None = None
        self.gathered: GatheredParams | None = None
        self.model_state: dict[str, int] | None = None
        self._forward_start: list[tuple[float, float]] = []
        for chunk in pm.chunks:
            chunk.register_forward_pre_hook(self._pre_forward, prepend=True)
            chunk.register_forward_hook(self._post_forward)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _now(self) -> tuple[float, float]:
        self._sync()
        return time.perf_counter(), time.thread_time()

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        self._forward_start.append(self._now())

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        wall0, cpu0 = self._forward_start.pop()
        wall1, cpu1 = self._now()
        self.spans.add("forward", wall0, wall1)
        self.times.phases_wall["forward"] += wall1 - wall0
        self.times.phases_cpu["forward"] += cpu1 - cpu0
        if self.gathered is not None:
            self.gathered.sample()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "forward":  # timed by the chunk hooks
            yield
            return
        wall0, cpu0 = self._now()
        with self.tracer.span(name):
            yield
        wall1, cpu1 = self._now()
        self.spans.add(name, wall0, wall1)
        self.times.phases_wall[name] += wall1 - wall0
        self.times.phases_cpu[name] += cpu1 - cpu0

    @contextlib.contextmanager
    def activations(self) -> Iterator[None]:
        if self.saved is None:
            yield
        else:
            with self.saved.counting():
                yield

    def after_optimizer(self, pm: ParallelModel) -> None:
        if self.saved is not None:  # the instrumented step
            self.model_state = model_state_bytes(pm)

    @contextlib.contextmanager
    def step(self, instrument: bool = False) -> Iterator[StepTimes]:
        """Time one whole step; with ``instrument`` also count saved activations and gathered params."""
        self.times = StepTimes()
        self.saved = SavedActivations() if instrument else None
        self.gathered = GatheredParams(self.pm) if instrument else None
        wall0, cpu0 = self._now()
        self.spans.begin(wall0)
        delay0, process0 = run_delay_s(), time.process_time()
        yield self.times
        wall1, cpu1 = self._now()
        delay1, process1 = run_delay_s(), time.process_time()
        self.times.wall = wall1 - wall0
        self.times.cpu = cpu1 - cpu0
        self.times.helper_threads = max(0.0, (process1 - process0) - self.times.cpu)
        if delay0 is not None and delay1 is not None:
            self.times.core_wait = max(0.0, delay1 - delay0)

    def phases(self) -> dict[str, float | None]:
        """forward, backward, optimizer, comm, core_wait and other (seconds) of the last timed step."""
        t = self.times
        src = t.phases_wall if self.cuda else t.phases_cpu
        forward = src.get("forward", 0.0)
        # in a pipeline the schedule interleaves forwards and backwards: backward = the rest
        backward = src["pipeline"] - forward if "pipeline" in src else src.get("backward", 0.0)
        optimizer = src.get("optimizer", 0.0)
        if self.cuda:
            return {"forward": forward, "backward": backward, "optimizer": optimizer, "comm": None,
                    "other": max(0.0, t.wall - forward - backward - optimizer)}
        waited = max(0.0, t.wall - t.cpu)
        core = None if t.core_wait is None else min(waited, t.core_wait)
        return {"forward": forward, "backward": backward, "optimizer": optimizer,
                "comm": waited - (core or 0.0), "core_wait": core,
                "other": max(0.0, t.cpu - forward - backward - optimizer), "helper_threads": t.helper_threads}
