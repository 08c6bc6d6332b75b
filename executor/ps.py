"""A parameter server on torch.distributed point-to-point messages (gloo send/recv).

The parameter-server modes (``plan.gradient_sync``: ``parameter-server``, ``async-parameter-
server``) run ``workers`` training processes (the plan's dp ranks, whole model each) and
``servers`` extra CPU processes (``plan.parameter_servers``, default one per node) in one
process group. Following Li et al., "Scaling Distributed Machine Learning with the Parameter
Server" (OSDI'14), and BytePS's even partition of the parameters:

- the flat fp32 parameter vector (the model's tensors in ``parameters()`` order) is cut into
  ``servers`` contiguous slices of equal size (+-1 element); server k holds slice k, as one
  ``nn.Parameter`` per piece of a model tensor (:class:`ServerShard`), and the plan's optimizer
  over those pieces (LAMB/LARS complete their per-tensor norms over the servers' group,
  :class:`executor.optim.SegmentNormSync`);
- a worker computes its gradient (mean over its micro-batches), *pushes* slice k of it to server
  k and *pulls* slice k of the updated parameters back (:class:`PSClient`, which stands in for the
  optimizer in :func:`executor.train.train_step`);
- synchronous mode: a server waits for every worker's push, averages them (the global-batch
  mean, so the losses equal a one-process run), steps its optimizer once and sends every worker
  the same parameters;
- asynchronous mode (Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012, Downpour
  SGD): a server takes pushes in arrival order (``recv`` from any source), applies each worker's
  gradient alone and replies to that worker at once. Each push carries the server version the
  worker's parameters came from; staleness = updates applied since then.

Ranks: per node ``workers_per_node`` workers then ``servers_per_node`` servers (the plan's
placement: servers on the training nodes, spread evenly); a worker's index is its dp rank.
Bytes are counted per message (tensor bytes; the async header of 2 floats included) and reported
per server and step, the figure of ``simdist.analytic.param_server.ps_traffic`` (``per_server_bytes``:
the server's in + out).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from executor.optim import SegmentNormSync, make_optimizer
from simdist.spec.plan import ParallelPlan

HEADER = 2  # async messages: [server version the parameters came from, worker step]


@dataclass(frozen=True, slots=True)
class Layout:
    """Which global rank is which worker or server (see the module docstring)."""

    workers: int
    servers: int
    workers_per_node: int
    servers_per_node: int

    @property
    def per_node(self) -> int:
        return self.workers_per_node + self.servers_per_node

    @property
    def world(self) -> int:
        return self.workers + self.servers

    def role(self, rank: int) -> tuple[str, int]:
        node, slot = divmod(rank, self.per_node)
        if slot < self.workers_per_node:
            return "worker", node * self.workers_per_node + slot
        return "server", node * self.servers_per_node + slot - self.workers_per_node

    def worker_rank(self, w: int) -> int:
        node, slot = divmod(w, self.workers_per_node)
        return node * self.per_node + slot

    def server_rank(self, k: int) -> int:
        node, slot = divmod(k, self.servers_per_node)
        return node * self.per_node + self.workers_per_node + slot


def server_count(plan: ParallelPlan, num_nodes: int) -> int:
    """``plan.parameter_servers``, or one per node (simdist.analytic.param_server.ps_server_count)."""
    return plan.parameter_servers or num_nodes


def make_layout(plan: ParallelPlan, num_nodes: int, nodes: int = 1) -> Layout:
    """The layout over ``nodes`` torchrun agents (1 for ``simdist run`` on this host)."""
    k = server_count(plan, num_nodes)
    return Layout(plan.world_size, k, plan.world_size // nodes, k // nodes)


def slice_bounds(n: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's slice of an n-element vector (equal sizes, +-1)."""
    return [(k * n // servers, (k + 1) * n // servers) for k in range(servers)]


def pieces(sizes: list[int], lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
    """(tensor index, start in the flat vector, length) of the tensors' parts inside [lo, hi)."""
    start = 0
    for i, size in enumerate(sizes):
        a, b = max(start, lo), min(start + size, hi)
        if a < b:
            yield i, a, b - a
        start += size


class Traffic:
    """Bytes a process sent and received, in total and per step."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0

    @property
    def total(self) -> int:
        return self.sent + self.received


def _wait(works: list[Any]) -> None:
    for w in works:
        w.wait()


# --- worker side --------------------------------------------------------------------------------


class PSClient:
    """Stands in for the optimizer on a worker: ``step()`` pushes the gradients and pulls the
    parameters. Holds no optimizer state (``state`` is empty), as simdist.analytic.memory says."""

    def __init__(self, params: list[nn.Parameter], layout: Layout, asynchronous: bool):
        self.param_groups = [{"params": params}]
        self.state: dict[Any, Any] = {}
        self.params = params
        self.layout = layout
        self.asynchronous = asynchronous
        self.n = sum(p.numel() for p in params)
        self.bounds = slice_bounds(self.n, layout.servers)
        self.versions = [0] * layout.servers
        self.traffic = Traffic()
        self.step_index = 0
        self.staleness_seen: list[int] = []

    def _install(self, k: int, values: torch.Tensor) -> None:
        lo, hi = self.bounds[k]
        with torch.no_grad():
            start = 0
            for p in self.params:
                a, b = max(start, lo), min(start + p.numel(), hi)
                if a < b:
                    p.view(-1)[a - start:b - start].copy_(values[a - lo:b - lo])
                start += p.numel()

    def _replies(self) -> list[torch.Tensor]:
        extra = HEADER if self.asynchronous else 0
        return [torch.empty(hi - lo + extra) for lo, hi in self.bounds]

    def pull_initial(self) -> None:
        """Receive every server's slice (at start and after a resume: the servers hold the truth)."""
        replies = [torch.empty(hi - lo + HEADER) for lo, hi in self.bounds]
        _wait([dist.irecv(r, src=self.layout.server_rank(k)) for k, r in enumerate(replies)])
        for k, r in enumerate(replies):
            self.versions[k] = int(r[0])
            self._install(k, r[HEADER:])

    @torch.no_grad()
    def step(self) -> None:
        grads = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                           for p in self.params])
        works = []
        for k, (lo, hi) in enumerate(self.bounds):
            msg = grads[lo:hi]
            if self.asynchronous:
                msg = torch.cat([torch.tensor([float(self.versions[k]), float(self.step_index)]), msg])
            msg = msg.contiguous()
            self.traffic.sent += msg.numel() * msg.element_size()
            works.append(dist.isend(msg, dst=self.layout.server_rank(k)))
        replies = self._replies()
        works += [dist.irecv(r, src=self.layout.server_rank(k)) for k, r in enumerate(replies)]
        _wait(works)
        for k, r in enumerate(replies):
            self.traffic.received += r.numel() * r.element_size()
            if self.asynchronous:
                self.versions[k] = int(r[0])
                r = r[HEADER:]
            self._install(k, r)
        self.step_index += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


# --- server side --------------------------------------------------------------------------------


class ServerShard(nn.Module):
    """A server's slice of the parameters: one flat nn.Parameter per piece of a model tensor,
    named ``t<tensor index>`` (FQNs ``pieces.t<i>``, distinct from other servers' under the
    checkpoint's per-server key)."""

    def __init__(self, flat: torch.Tensor, sizes: list[int], lo: int, hi: int):
        super().__init__()
        self.lo, self.hi = lo, hi
        self.index: list[tuple[int, int, int]] = list(pieces(sizes, lo, hi))
        self.pieces = nn.ParameterDict({
            f"t{i}": nn.Parameter(flat[start:start + length].clone()) for i, start, length in self.index})

    def ordered(self) -> list[nn.Parameter]:
        return [self.pieces[f"t{i}"] for i, _, _ in self.index]

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach() for p in self.ordered()])

    def set_grad(self, grad: torch.Tensor) -> None:
        offset = 0
        for p in self.ordered():
            p.grad = grad[offset:offset + p.numel()]
            offset += p.numel()


class Server:
    """Server ``index``: holds its slice and the optimizer, serves the workers' pushes."""

    def __init__(self, index: int, layout: Layout, plan: ParallelPlan, params: list[torch.Tensor],
                 server_group: dist.ProcessGroup | None):
        self.index, self.layout, self.plan = index, layout, plan
        self.asynchronous = plan.async_parameter_servers
        sizes = [p.numel() for p in params]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        lo, hi = slice_bounds(flat.numel(), layout.servers)[index]
        self.shard = ServerShard(flat, sizes, lo, hi)
        ordered = self.shard.ordered()
        sync = SegmentNormSync(server_group, {id(p): i for p, (i, _, _) in zip(ordered, self.shard.index, strict=True)},
                               len(sizes))
        self.optimizer = make_optimizer(list(ordered), plan.optimizer, None, sync)
        self.version = 0
        self.traffic = Traffic()
        self.staleness: Counter[int] = Counter()
        self.update_s = 0.0
        self.steps_served = 0

    def _send(self, dst: int) -> Any:
        msg = torch.cat([torch.tensor([float(self.version), 0.0]), self.shard.flat()])
        return dist.isend(msg, dst=dst), msg

    def send_initial(self) -> None:
        """Every worker's first pull (not counted as step traffic)."""
        handles = [self._send(self.layout.worker_rank(w)) for w in range(self.layout.workers)]
        _wait([h for h, _ in handles])

    def _apply(self, grad: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self.shard.set_grad(grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.update_s += time.perf_counter() - t0

    def serve_step(self) -> None:
        """Synchronous mode, one step: every worker's push, one update, every worker's pull."""
        n = self.shard.hi - self.shard.lo
        bufs = [torch.empty(n) for _ in range(self.layout.workers)]
        _wait([dist.irecv(b, src=self.layout.worker_rank(w)) for w, b in enumerate(bufs)])
        self.traffic.received += sum(b.numel() * b.element_size() for b in bufs)
        total = bufs[0].clone()
        for b in bufs[1:]:
            total.add_(b)
        self._apply(total.div_(self.layout.workers))
        out = self.shard.flat()
        works = [dist.isend(out, dst=self.layout.worker_rank(w)) for w in range(self.layout.workers)]
        _wait(works)
        self.traffic.sent += self.layout.workers * out.numel() * out.element_size()
        self.steps_served += 1

    def serve_async(self, pushes: int) -> None:
        """Asynchronous mode: ``pushes`` pushes in arrival order, each applied and answered alone."""
        n = self.shard.hi - self.shard.lo
        pending: list[tuple[Any, torch.Tensor]] = []
        for _ in range(pushes):
            buf = torch.empty(n + HEADER)
            src = dist.recv(buf)  # from any worker
            self.traffic.received += buf.numel() * buf.element_size()
            self.staleness[self.version - int(buf[0])] += 1
            self._apply(buf[HEADER:].clone())
            work, msg = self._send(src)
            pending.append((work, msg))
            self.traffic.sent += msg.numel() * msg.element_size()
        _wait([w for w, _ in pending])
        self.steps_served = pushes // self.layout.workers

    def report(self) -> dict[str, Any]:
        params = sum(p.numel() * p.element_size() for p in self.shard.parameters())
        optimizer = sum(v.numel() * v.element_size() for s in self.optimizer.state.values()
                        for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return {
            "server": self.index,
            "elements": self.shard.hi - self.shard.lo,
            "bytes_sent": self.traffic.sent,
            "bytes_received": self.traffic.received,
            "steps_served": self.steps_served,
            "model_state_bytes": {"params": params, "grads": params, "optimizer": optimizer,
                                  "total": 2 * params + optimizer},
            "update_s": self.update_s,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
        }


def build_worker(m: Any, plan: ParallelPlan, index: int, layout: Layout, device: torch.device,
                 seed: int) -> Any:
    """Worker ``index``'s whole model, with a PSClient as its optimizer (a ParallelModel)."""
    from executor.model import build_model
    from executor.parallelize import ParallelModel
    from simdist.spec.frameworks import recompute_early_stop
    from simdist.spec.plan import rank_coord

    model = build_model(m, seed, recompute=plan.recompute, early_stop=recompute_early_stop(plan)).to(device)
    client = PSClient(list(model.parameters()), layout, plan.async_parameter_servers)
    return ParallelModel(coord=rank_coord(index, plan), chunks=[model], optimizer=client,  # type: ignore[arg-type]
                         schedule=None, data_parallel="parameter-server", holds_input=True, holds_loss=True)


def build_server(m: Any, plan: ParallelPlan, index: int, layout: Layout, seed: int,
                 server_group: dist.ProcessGroup | None) -> Server:
    """Server ``index`` with its slice of the model built from ``seed`` (as every worker builds it)."""
    from executor.model import build_model

    params = list(build_model(m, seed).parameters())
    return Server(index, layout, plan, params, server_group)
