"""Synthetic token batches, drawn by global sample index.

Sample ``i`` of the run is a function of (seed, i) only, drawn from its own torch.Generator, so
every plan, whatever its dp degree or micro-batch split, trains on exactly the same global
batch: step ``t`` uses samples ``t*G .. t*G+G-1`` (G = global_batch_size); data-parallel rank
``d`` takes the d-th contiguous slice of G/dp samples and cuts it into micro-batches.

Each sample follows a fixed bigram rule, next = (5 * token + 3) mod vocab (a permutation of
the vocabulary when it is even, as 5 and 3 are odd), from a random start, with a quarter of the
tokens replaced by random ones: enough structure that the loss falls within a few steps, and
noise that keeps it from reaching zero.
"""

from __future__ import annotations

import torch

NOISE = 0.25  # fraction of tokens drawn at random instead of by the bigram rule
_MIX = 1_000_003  # a prime; keeps (seed, index) -> generator seed one-to-one for index < _MIX


def sample_tokens(seed: int, index: int, seq_length: int, vocab_size: int) -> torch.Tensor:
    """Tokens of global sample ``index``: a LongTensor of seq_length + 1 ids (inputs + 1 target)."""
    gen = torch.Generator(device="cpu").manual_seed(seed * _MIX + index)
    random_tokens = torch.randint(0, vocab_size, (seq_length + 1,), generator=gen).tolist()
    noisy = (torch.rand(seq_length + 1, generator=gen) < NOISE).tolist()
    out = [random_tokens[0]]
    for k in range(1, seq_length + 1):
        out.append(random_tokens[k] if noisy[k] else (5 * out[-1] + 3) % vocab_size)
    return torch.tensor(out, dtype=torch.long)


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
