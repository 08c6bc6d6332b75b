"""The loss's HBM traffic per framework, against an independent count of its kernels: Megatron-
Core's unfused vocabulary-parallel cross-entropy, PyTorch's F.cross_entropy on fp32 logits, and
a fused loss kernel."""

from __future__ import annotations

import pytest

from simdist.analytic.ops import Compute, head_ops
from simdist.spec.scenario import scenario_from_dict

# (bytes read, bytes written) per logit of each kernel, forward then backward
KERNELS = {
    "megatron": ({"to fp32": (2, 4), "max": (4, 0), "subtract max": (4, 4), "exp": (4, 4), "sum": (4, 0),
                  "divide": (4, 4)},
                 {"scale by the loss gradient": (4, 4), "to bf16": (4, 2)}),
    "torchtitan": ({"to fp32": (2, 4), "log_softmax (max, exp-sum, output passes)": (12, 4)},
                   {"nll_loss backward (zeroed gradient)": (0, 4), "log_softmax backward": (8, 4), "to bf16": (4, 2)}),
    None: ({"three fp32 passes": (12, 0)}, {"two fp32 passes": (8, 0)}),
}


@pytest.mark.parametrize("framework", list(KERNELS))
@pytest.mark.parametrize("tp", [1, 4])
def test_cross_entropy_moves_every_kernels_bytes(framework, tp):
    plan = {"tp": tp, "global_batch_size": 16, "micro_batch_size": 2}
    if framework:
        plan["framework"] = framework
    sc = scenario_from_dict({"name": "t", "model": {"preset": "llama3-8b", "seq_length": 4096},
                             "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "plan": plan})
    logits = 4096 * 2 * sc.model.vocab_size / tp  # one micro-batch's logits on one TP rank
    for phase, kernels in zip(("fwd", "bwd"), KERNELS[framework], strict=True):
        ce = [op for op in head_ops(sc.model, sc.plan, phase) if isinstance(op, Compute) and op.name.startswith("cross")]
        assert len(ce) == 1
        assert ce[0].bytes == pytest.approx(logits * sum(r + w for r, w in kernels.values()), rel=1e-12)
