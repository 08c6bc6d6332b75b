"""Synthetic token batches, drawn by global sample index.

Sample ``i`` of the run is a function of (seed, i) only, drawn from its own torch.Generator, so
every plan, whatever its dp degree or micro-batch split, trains on exactly the same global
batch: step ``t`` uses samples ``t*G .. t*G+G-1`` (G = global_batch_size); data-parallel rank
``d`` takes the d-th contiguous slice of G/dp samples and cuts it into micro-batches.

Each sample is an arithmetic progression modulo the vocabulary with a random start and
stride: enough structure that the loss falls within a few steps (the model can read the
stride off the first two tokens), none that depends on the plan.
"""

from __future__ import annotations

import torch

_MIX = 1_000_003  # a prime; keeps (seed, index) -> generator seed one-to-one for index < _MIX


def sample_tokens(seed: int, index: int, seq_length: int, vocab_size: int) -> torch.Tensor:
    """Tokens of global sample ``index``: a LongTensor of seq_length + 1 ids (inputs + 1 target)."""
    gen = torch.Generator(device="cpu").manual_seed(seed * _MIX + index)
    start, stride = torch.randint(0, vocab_size, (2,), generator=gen).tolist()
    steps = torch.arange(seq_length + 1, dtype=torch.long)
    return (start + stride * steps) % vocab_size


def token_batch(seed: int, first: int, count: int, seq_length: int, vocab_size: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, each (count, seq_length), of samples first .. first+count-1."""
    rows = torch.stack([sample_tokens(seed, first + j, seq_length, vocab_size) for j in range(count)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def first_sample(step: int, global_batch_size: int, dp: int, dp_rank: int) -> int:
    """Global index of the first sample that data-parallel rank ``dp_rank`` trains on at ``step``."""
    return step * global_batch_size + dp_rank * (global_batch_size // dp)


def replica_batch(seed: int, step: int, global_batch_size: int, dp: int, dp_rank: int,
                  seq_length: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (global_batch_size / dp) samples of one data-parallel replica at ``step``."""
    per_replica = global_batch_size // dp
    first = first_sample(step, global_batch_size, dp, dp_rank)
    return token_batch(seed, first, per_replica, seq_length, vocab_size)
