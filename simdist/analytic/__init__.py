"""The analytic layer: what runs and what it costs, in closed form (no simpy).

Above :mod:`simdist.spec`, below :mod:`simdist.sim`:

- what runs: ``params``, ``flops``, ``ops`` (one layer's kernels and collectives);
- what it costs: ``cost`` (compute on one GPU), ``collectives`` (alpha-beta on the links),
  ``passes`` (an op list with its exposed TP/CP communication), ``profile_terms`` (what a
  calibration profile adds to it per op and per sync point);
- the mechanisms, one module each: ``data_parallel``, ``compression``, ``offload``,
  ``param_server``, ``overlap``; and ``memory`` per GPU;
- ``stage``: the per-stage description both engines consume; ``steptime``: the closed-form
  engine, which reduces it; ``result``: what an engine returns.
"""
