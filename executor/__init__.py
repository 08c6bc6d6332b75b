"""The real executor: trains a scenario's model with its plan on this machine, with torch.distributed.

This is the only package in the project that imports ``torch.distributed``, and of simdist it
imports only the spec (``simdist.spec``, ``simdist.units``, ``simdist.errors``): the plan it runs
and the measurement it writes. Importing ``executor`` itself stays light: :mod:`executor.launch`
(what ``simdist run`` calls), :mod:`executor.torchrun` (the one launcher) and
:mod:`executor.checks` import no torch, so the CLI can refuse a bad plan before paying for
``import torch``. The torch-side modules are:

- :mod:`executor.model`: the decoder-only transformer built from a ModelSpec, and its split
  into pipeline chunks;
- :mod:`executor.data`: synthetic token batches drawn by global sample index;
- :mod:`executor.parallelize`: DeviceMesh, DDP / ZeRO-1 / FSDP2, tensor and sequence parallel,
  pipeline schedules;
- :mod:`executor.measure`: model-state bytes, saved-activation bytes, collective census, timers;
- :mod:`executor.train`: one training step for every plan kind (also the one-process reference);
- :mod:`executor.optim`: Adam, AdamW, SGD from torch; LAMB and LARS written here, with the norm
  all-reduces that sharded tensors need;
- :mod:`executor.compression`: gradient compression as DDP communication hooks, and their bytes;
- :mod:`executor.ps`: the parameter server (synchronous and asynchronous) on point-to-point gloo;
- :mod:`executor.checkpoint`: torch.distributed.checkpoint saves (atomic) and resume;
- :mod:`executor.report`: rank 0's measurement, restart times included;
- :mod:`executor.worker`: the torchrun worker entry (``python -m executor.worker``);
- :mod:`executor.bench`: the calibration microbenchmarks (``simdist calibrate``), a torchrun
  worker too.

Torch-free too: :mod:`executor.faults` (run-directory files: heartbeats, failures, events, the
checkpoint directory's layout) and :mod:`executor.multinode` (``--print-launch``).
"""
