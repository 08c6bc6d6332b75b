"""The real executor: trains a scenario's model with its plan on this machine, with torch.distributed.

This is the only package in the project that imports ``torch.distributed``. Importing
``executor`` itself stays light: :mod:`executor.launch` (the ``simdist run`` command) and
:mod:`executor.checks` import no torch, so the CLI can refuse a bad plan before paying for
``import torch``. The torch-side modules are:

- :mod:`executor.model`: the decoder-only transformer built from a ModelSpec, and its split
  into pipeline chunks;
- :mod:`executor.data`: synthetic token batches drawn by global sample index;
- :mod:`executor.parallelize`: DeviceMesh, DDP / ZeRO-1 / FSDP2, tensor and sequence parallel,
  pipeline schedules;
- :mod:`executor.measure`: model-state bytes, saved-activation bytes, collective census, timers;
- :mod:`executor.train`: one training step for every plan kind (also the one-process reference);
- :mod:`executor.worker`: the torchrun worker entry (``python -m executor.worker``).
"""
