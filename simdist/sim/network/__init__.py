"""The event engine's network: a narrow backend interface (:mod:`.backend`) and today's
implementation, link loads (:mod:`.links`) shared as a fluid (:mod:`.fluid`)."""

from simdist.sim.network.backend import FluidBackend, NetworkBackend
from simdist.sim.network.fluid import FluidNetwork
from simdist.sim.network.links import (
           FlowTiming,
           LinkModel,
           host_link,
           node_resource,
           software_resource,
)

__all__ = ["FlowTiming", "FluidBackend", "FluidNetwork", "LinkModel", "NetworkBackend", "host_link",
           "node_resource", "software_resource"]
