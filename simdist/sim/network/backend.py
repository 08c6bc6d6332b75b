"""The narrow interface between the event engine and the network it runs on, as astra-sim splits
its system layer from its network backends.

The engine asks a :class:`NetworkBackend` to move data (a collective over a plan axis, a
pipeline send, a transfer on a host resource, a parameter-server push or pull, the servers'
update) and waits for the event it returns; it never looks at links. :class:`FluidBackend`
is today's backend: the transfers' solo times and link loads (:mod:`simdist.sim.network.links`)
shared as a fluid (:mod:`simdist.sim.network.fluid`). A backend without contention (each
transfer its solo time) fits the same interface.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from simdist.analytic.collectives import Network
from simdist.sim import kernel
from simdist.sim.network.fluid import FluidNetwork, Route
from simdist.sim.network.links import HOST_DIRECTION, LinkModel, host_link, node_resource
from simdist.spec.scenario import Scenario


class NetworkBackend(Protocol):
    """How the engine's transfers take time. Each method starts one transfer now and returns the
    event that fires when it is done. ``stage`` and ``replicas`` name the ranks that take part:
    the pipeline stage and the data-parallel replicas simulated (a representative stands for
    the replicas that are not)."""

    def collective(self, kind: str, nbytes: float, axis: str, stage: int, replicas: tuple[int, ...],
                   extra_s: float = 0.0) -> kernel.Event:
        """A collective of buffer size ``nbytes`` over ``axis``, then ``extra_s`` more."""
        ...

    def p2p(self, nbytes: float, src_stage: int, dst_stage: int, replica: int, extra_s: float = 0.0) -> kernel.Event:
        """A pipeline send between two stages of one replica, then ``extra_s`` more."""
        ...

    # optional: ``p2p_at(nbytes, src_stage, dst_stage, replica, extra_s)``, a function of an
    # instant ``at`` (now or later) giving the completion of the send p2p would start at ``at``,
    # or None where the backend cannot tell it now (FluidBackend.p2p_at); the engine then calls
    # p2p at ``at``

    def host(self, resource: str, seconds: float, stage: int, replica: int) -> kernel.Event:
        """One GPU's transfer of ``seconds`` alone on a host resource (work.HOST_RESOURCES)."""
        ...

    def ps(self, kind: str, nbytes: float, stage: int, replicas: tuple[int, ...]) -> kernel.Event:
        """A parameter-server push ("push") or pull ("pull") of ``nbytes`` per worker."""
        ...

    def ps_update(self, seconds: float) -> kernel.Event:
        """The servers applying one bucket: ``seconds`` on the busiest server node, alone."""
        ...

    def assumptions(self) -> list[str]:
        """How the backend times transfers, and what contention did, in plain sentences."""
        ...

    def usage(self, elapsed: float) -> dict[str, Any]:
        """What the links carried over ``elapsed`` seconds, for the prediction's extras."""
        ...


class FluidBackend:
    """Links of the cluster shared as a fluid: a link carrying more than its bandwidth slows
    every flow on it in proportion (see simdist.sim.network.fluid)."""

    def __init__(self, env: kernel.Environment, sc: Scenario, net: Network, replicas_alike: bool):
        plan = sc.plan
        self.sc = sc
        self.links = LinkModel(sc, net, replicas_alike)
        self.fluid = FluidNetwork(env, track=plan.uses_parameter_servers or plan.offload.any)
        self._sends: dict[tuple, Route] = {}  # a pipeline send's arguments -> its transfer

    def collective(self, kind: str, nbytes: float, axis: str, stage: int, replicas: tuple[int, ...],
                   extra_s: float = 0.0) -> kernel.Event:
        t = self.links.collective(kind, nbytes, axis, stage, replicas)
        return self.fluid.transfer(t.work, t.loads, t.latency + extra_s)

    def p2p(self, nbytes: float, src_stage: int, dst_stage: int, replica: int, extra_s: float = 0.0) -> kernel.Event:
        return self.fluid.start(self._route(nbytes, src_stage, dst_stage, replica, extra_s))

    def p2p_at(self, nbytes: float, src_stage: int, dst_stage: int, replica: int, extra_s: float = 0.0,
               ) -> Callable[[float], kernel.Event | None]:
        """The pipeline send :meth:`p2p` makes, to be asked for ahead: called with an instant
        ``at`` (now or later), it gives the send's completion as if :meth:`p2p` were called at
        ``at``, known now where nothing else uses its links (FluidNetwork.reserve), or None
        where that is not sure now (the caller then calls :meth:`p2p` at ``at``)."""
        return partial(self.fluid.reserve, self._route(nbytes, src_stage, dst_stage, replica, extra_s))

    def _route(self, nbytes: float, src_stage: int, dst_stage: int, replica: int, extra_s: float) -> Route:
        key = (nbytes, src_stage, dst_stage, replica, extra_s)
        route = self._sends.get(key)
        if route is None:
            t = self.links.p2p(nbytes, src_stage, dst_stage, replica)
            route = self._sends[key] = self.fluid.route(t.work, t.loads, t.latency + extra_s)
        return route

    def host(self, resource: str, seconds: float, stage: int, replica: int) -> kernel.Event:
        t = self.links.host(resource, seconds, stage, replica)
        return self.fluid.transfer(t.work, t.loads)

    def ps(self, kind: str, nbytes: float, stage: int, replicas: tuple[int, ...]) -> kernel.Event:
        t = self.links.ps(kind, nbytes, stage, replicas)
        return self.fluid.transfer(t.work, t.loads, t.latency)

    def ps_update(self, seconds: float) -> kernel.Event:
        t = self.links.ps_update(seconds)
        return self.fluid.transfer(t.work, t.loads)

    def release(self) -> None:
        """The run is over: drop what holds reference cycles (FluidNetwork.release)."""
        self.fluid.release()

    def assumptions(self) -> list[str]:
        plan = self.sc.plan
        out = ["event engine: links shared as a fluid (NIC, NVSwitch port, leaf uplink"
               + (", PCIe, NVMe, host CPU" if plan.offload.any or plan.uses_parameter_servers else "")
               + "); TP/CP collectives timed in closed form inside each layer; pipeline sends block the sender "
               "(but Megatron's overlapped ones, and torch's isends on a CPU whose cores all compute)"]
        if self.fluid.peak_overload > 1.0 + 1e-6:
            out.append(f"link contention slowed transfers by up to {self.fluid.peak_overload:.2f}x")
        return out

    def usage(self, elapsed: float) -> dict[str, Any]:
        """The bottleneck the parameter servers' traffic met, and how busy the host resources of
        the first simulated GPU were (offload)."""
        fluid, plan = self.fluid, self.sc.plan
        if not fluid.track:
            return {}
        out: dict[str, Any] = {}
        top = fluid.busiest()
        if plan.uses_parameter_servers and top is not None:
            (link, direction), busy = top
            out["parameter_servers"] = {"bottleneck_link": f"{link} {direction}", "bottleneck_busy_s": busy,
                                        "bottleneck_busy_fraction": busy / elapsed}
        if plan.offload.any:
            c = self.sc.cluster
            rep = self.links.rep(0, 0)
            keys = {f"{r}_busy_s": (host_link(c, rep), d) for r, d in HOST_DIRECTION.items()}
            keys |= {f"{r}_busy_s": (node_resource(r, c.node_of(rep)), "up") for r in ("nvme", "cpu")}
            out["offload"] = {name: fluid.busy.get(key, 0.0) for name, key in keys.items()}
        return out
