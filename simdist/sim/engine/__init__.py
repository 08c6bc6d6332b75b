"""The discrete-event engine (on simdist.sim.kernel): every simulated rank's compute and communication streams
over the cluster's links, for one optimizer step.

A *slice* is the tensor- and context-parallel group of one pipeline stage of one data-parallel
replica: its ranks run the same kernels in lock-step (TP/CP collectives inside every layer
synchronise them), so one process drives its compute stream. Symmetric fidelity simulates
one slice per stage (replica 0; the other replicas do the same work at the same time, and their
load on shared links is counted by the network backend); full fidelity simulates every replica,
so stragglers and slow nodes delay the collectives that wait for them.

The parts, each in its own module:

- :mod:`.simulation`: ``simulate()``, fidelity and stragglers, the parts wired together;
- :mod:`.state`: the shared state (environment, network backend, slices, spans);
- :mod:`.step`: the step driver (the schedule's actions, waits, sends); :mod:`.flush`, what
  follows the flush;
- :mod:`.streams`: the FIFO streams beside compute, and the meeting points of collectives;
- :mod:`.servers`: parameter servers, synchronous and asynchronous;
- :mod:`.accounting`: the breakdown, whose parts sum to the step time;
- :mod:`.assumptions`, :mod:`.stragglers`: what the engine says about the run;
- :mod:`.budget`: the work of a simulation, estimated before it runs, and its limits;
- :mod:`.periodic`: a long 1F1B / interleaved / zero-bubble step simulated short and stretched,
  exactly, once its steady state repeats;
- :mod:`.grouping`: full fidelity as one group per stage where no straggler sets ranks apart.

The work comes from the lowering of the per-stage description (:mod:`simdist.sim.lowering`) and
every transfer goes through the narrow network interface (:mod:`simdist.sim.network`).

Where this engine and the closed form (:mod:`simdist.analytic.steptime`) differ by mechanism,
not only by link contention the closed form does not see:

- asynchronous parameter servers: the closed form takes the larger of a worker's own cycle (its
  push and pull at its share of the NIC) and the busiest NIC's traffic per cycle; here a worker's
  push shares its node's NIC with the replies its node's server sends to the other workers at
  the same time, so the two partly add (4 workers on 25 GbE: +14%, 16: +23%);
- parameter servers with coarse buckets: the last bucket is pulled only after its push and its
  update, a drain the closed form's bucket formula leaves out (ps1 on 25 GbE: +0.5% with 25 MiB
  buckets, +5% with 256 MiB);
- ZeRO-3/FSDP parameter offload with the optimizer on the GPU: the updated shard goes back to the
  host after the optimizer (exposed here; the closed form overlaps it with backward);
- offload with several pipeline stages on one node: the node's CPU is shared by stages whose
  shards differ and whose last backward ends at different times; the closed form charges every
  GPU of the node the busiest stage's shard at once (this engine is lower);
- ZeRO-0/1 optimizer offload with dp > 1: each bucket's copy to the host follows its reduction
  and overlaps the next one; the closed form adds the two.
"""

from simdist.sim.engine.simulation import FIDELITIES, simulate

__all__ = ["FIDELITIES", "simulate"]
