"""The event layer: pipeline schedules, lowering of the per-stage description to tasks, the
network backends and the discrete-event engine (its kernel: simdist.sim.kernel)."""
