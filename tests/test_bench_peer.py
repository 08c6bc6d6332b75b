"""benchmarks/peer_calculon.py's mapping of a scenario to Calculon's inputs (no Calculon needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios"


def _peer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_calculon", ROOT / "benchmarks" / "peer_calculon.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peer = _peer()


def _changed(name: str, **plan: Any) -> Scenario:
    data = yaml.safe_load((SCEN / name).read_text())
    data["plan"].update(plan)
    return scenario_from_dict(data)


def test_gpt3_plan_as_calculon_execution() -> None:
    sc = load_scenario(SCEN / "gpt3-175b-1024xa100.yaml")
    assert peer.calculon_execution(sc) == {
        "num_procs": 1024, "tensor_par": 8, "pipeline_par": 16, "data_par": 8,
        "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
        "batch_size": 1536, "microbatch_size": 1, "datatype": "float16", "fused_activation": False,
        "attention_type": "multihead", "activation_recompute": "full", "pipeline_interleaving": 2,
        "optimizer_sharding": False, "tensor_par_comm_type": "ar", "tensor_par_overlap": "none",
        "seq_par_ag_redo": False, "data_par_overlap": False, "weight_offload": False,
        "activations_offload": False, "optimizer_offload": False, "training": True}
    # the same shape as Calculon's models/gpt3-175B.json
    assert peer.calculon_application(sc.model) == {"hidden": 12288, "feedforward": 49152, "seq_size": 2048,
                                                   "attn_heads": 96, "attn_size": 128, "num_blocks": 96}
    assert peer.calculon_system_file(sc.cluster) == "a100_80g.json"
    assert peer.calculon_label(peer.calculon_execution(sc)) == "TP8 PP16 DP8 v2 Z0 full mb1 batch 1536"


def test_megatron_1t_plan_as_calculon_execution() -> None:
    sc = load_scenario(SCEN / "megatron-1t-3072xa100.yaml")
    exe = peer.calculon_execution(sc)
    assert (exe["num_procs"], exe["tensor_par"], exe["pipeline_par"], exe["data_par"]) == (3072, 8, 64, 6)
    assert (exe["pipeline_interleaving"], exe["batch_size"], exe["activation_recompute"]) == (1, 3072, "full")
    # the same shape as Calculon's models/megatron-1T.json
    assert peer.calculon_application(sc.model) == {"hidden": 25600, "feedforward": 102400, "seq_size": 2048,
                                                   "attn_heads": 160, "attn_size": 160, "num_blocks": 128}


def test_plan_fields_that_map() -> None:
    sc = _changed("gpt3-175b-1024xa100.yaml", sequence_parallel=True, zero_stage=1, recompute="selective",
                  overlap_grad_reduce=True, fused_elementwise=True)
    exe = peer.calculon_execution(sc)
    assert exe["tensor_par_comm_type"] == "rs_ag" and exe["optimizer_sharding"] is True
    assert exe["activation_recompute"] == "attn_only" and exe["data_par_overlap"] is True
    assert exe["fused_activation"] is True
    assert peer.calculon_label(exe) == "TP8 PP16 DP8 v2 Z1 SP selective mb1 batch 1536"


def test_networks_follow_the_rank_grid() -> None:
    assert peer._networks(8, 16, 8, 8) == (0, 1, 1)
    assert peer._networks(2, 2, 256, 8) == (0, 0, 1)
    assert peer._networks(2, 4, 1, 8) == (0, 0, 0)
    assert peer._networks(16, 1, 64, 8) == (1, 1, 1)


@pytest.mark.parametrize("plan, what", [({"zero_stage": 3}, "ZeRO-2/3"), ({"flash_attention": True}, "fused"),
                                        ({"cp": 2, "global_batch_size": 768}, "context parallelism")])
def test_what_calculon_cannot_express(plan: dict[str, Any], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        peer.calculon_execution(_changed("gpt3-175b-1024xa100.yaml", **plan))


def test_swiglu_and_other_gpus_are_refused() -> None:
    llama = load_scenario(SCEN / "llama3-70b-tp8-pp4-64xh100.yaml")
    with pytest.raises(ValueError, match="two projections"):
        peer.calculon_application(llama.model)
    with pytest.raises(ValueError, match="no Calculon system"):
        peer.calculon_system_file(llama.cluster)


def test_parse_search_log() -> None:
    text = ("Total executions: 1200\nGood executions: 300\nBad executions: 900\n"
            "Calculation rate: 650.25 calcs/sec\nBest sample rate: 50.1\n")
    assert peer.parse_search_log(text) == {"plans": 1200, "good": 300, "plans_per_s": 650.25}
    with pytest.raises(ValueError, match="Total executions"):
        peer.parse_search_log("No acceptable configurations found :(")
