"""`simdist calibrate --from-logs`: training logs in each framework's exact line format, and a
calibration from one cluster's logs that predicts its other logs.

The step times of the cluster tests are published measurements (simdist/validate/data/
training_runs.csv, each row citing its source) written out as the logs those jobs print:
Megatron-LM GPT runs on Selene (Narayanan et al. SC'21, Table 1: 32 to 3072 A100s), torchtitan
Llama 3.1 8B on Grand Teton H100s (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md,
8 and 128 GPUs), and Megatron-Core GPT weak scaling on H100s (Megatron-Core r0.8.0, 2024) in
NeMo 2's console format. The first log lines of each carry a slower warm-up step, as real logs do.
"""

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from simdist.calibrate.logs import LogRun, detect, median_step, parse_log
from simdist.calibrate.store import RunStore
from simdist.validate.rows import packaged_data_dir

ESC = "\x1b[{}m"


def megatron_log(args: dict, times_s: list[float], tflops: float | None = None) -> str:
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    lines.append("-------------------- end of arguments ---------------------")
    gbs = int(args.get("global_batch_size", 8))
    for i, t in enumerate(times_s, start=1):
        tf = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" if tflops else ""
        lines.append(f" [2021-04-01 10:{i:02d}:00] iteration {i * 10:8d}/{1000:8d} | consumed samples: "
                     f"{i * 10 * gbs:12d} | elapsed time per iteration (ms): {t * 1000:.1f} |{tf} learning rate: "
                     f"1.500000E-04 | global batch size: {gbs:5d} | lm loss: {7.5 - i / 100:.6E} | loss scale: "
                     "65536.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |")
        if i == 1:
            lines.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 20480.5 | max allocated: 61234.5 | "
                         "reserved: 65536.0 | max reserved: 65536.0")
    return "\n".join(lines) + "\n"


def titan_log(tps: list[float], memory_gib: float = 82.4) -> str:
    lines = ["[titan] 2024-12-10 10:00:00,000 - root - INFO - Starting job: Llama 3 8B training"]
    for i, t in enumerate(tps, start=1):
        lines.append(f"[titan] 2024-12-10 10:{i:02d}:00,000 - root - INFO - {ESC.format(31)}step: {i * 10:2}  "
                     f"{ESC.format(32)}loss: {8 - i / 10:7.4f}  {ESC.format(33)}memory: {memory_gib:5.2f}GiB"
                     f"({memory_gib / 95 * 100:.2f}%)  {ESC.format(34)}tps: {round(t):,}  {ESC.format(36)}tflops: "
                     f"{t * 6 * 8.03e9 / 1e12:,.2f}  {ESC.format(35)}mfu: 33.70%{ESC.format(39)}")
    return "\n".join(lines) + "\n"


def nemo_log(times_s: list[float], gbs: int) -> str:
    lines = []
    for i, t in enumerate(times_s):
        lines.append(f"Training epoch 0, iteration {i}/99 | lr: {1.5e-5 * (i + 1):.3e} | global_batch_size: {gbs} | "
                     f"global_step: {i} | reduced_train_loss: {10.9 - i / 10:.4g} | train_step_timing in s: {t:.4g}"
                     + (f" | consumed_samples: {gbs * i}" if i else ""))
    return "\n".join(lines) + "\n"


def with_warmup(t: float, n: int = 10) -> list[float]:
    """A log's step times: a slow first step, then +-0.4% around ``t``."""
    return [t * 1.6] + [t * (1 + 0.004 * ((i * 7) % 5 - 2)) for i in range(1, n)]


# --- the readers -------------------------------------------------------------------------------------


def test_megatron_lines_and_arguments_are_read():
    text = megatron_log({"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 2, "num_layers": 48,
                         "num_layers_per_virtual_pipeline_stage": 3, "world_size": 512, "micro_batch_size": 8,
                         "global_batch_size": 1536, "hidden_size": 8192}, with_warmup(14.45), tflops=163.0)
    run = parse_log("r.log", text)
    assert run.framework == "megatron" and run.iterations[0] == 20  # the first (warm-up) line skipped
    assert run.step_times_s == pytest.approx(with_warmup(14.45)[1:], rel=1e-4)
    assert run.tflops_per_gpu == [163.0] * 9 and run.losses[0] == pytest.approx(7.48)
    assert run.memory_gib == pytest.approx(61234.5 / 1024) and run.memory_kind == "max allocated"
    assert run.overrides() == {"plan.tp": 8, "plan.pp": 2, "plan.micro_batch_size": 8, "plan.global_batch_size": 1536,
                               "model.num_layers": 48, "model.hidden_size": 8192,
                               "plan.virtual_pipeline_stages": 8, "world_size": 512}
    # forks that print a running mean beside the interval's time
    fork = re.sub(r"(elapsed time per iteration \(ms\): [\d.]+) \|", r"\1/14460.3 |", text)
    assert fork != text and parse_log("r.log", fork).step_times_s == run.step_times_s


def test_torchtitan_lines_give_step_times_from_tokens_per_second():
    run = parse_log("t.log", titan_log(with_warmup(5762.0)))
    assert run.framework == "torchtitan" and run.iterations == list(range(20, 101, 10))
    assert run.memory_gib == 82.4 and run.memory_kind == "max reserved" and run.losses[0] == pytest.approx(7.8)
    times = median_step(run, tokens_per_step=16 * 8192, world_size=8)  # a step: 16 x 8192 tokens on 8 GPUs
    assert times == pytest.approx([16 * 8192 / (round(t) * 8) for t in with_warmup(5762.0)[1:]])


def test_nemo_2_lines_and_nemo_1_progress_bars_are_read():
    run = parse_log("n.log", nemo_log(with_warmup(2.345), gbs=128))
    assert run.framework == "nemo" and run.iterations[0] == 1 and len(run.step_times_s) == 9
    assert run.losses[0] == pytest.approx(10.8)
    bar = ("Epoch 0: : 100%|##########| 100/100 [10:48<00:00, reduced_train_loss=0.0172, global_step=99.00, "
           "consumed_samples=25600.0, train_step_timing in s=3.130]")
    assert detect(bar) == "nemo" and parse_log("b.log", bar + "\n" + bar).step_times_s == [3.13]


def test_a_log_of_no_known_framework_is_refused(tmp_path):
    (tmp_path / "x.log").write_text("epoch 1 done\n")
    (tmp_path / "s.yaml").write_text("name: s\n")
    r = run_cli("calibrate", "--from-logs", str(tmp_path / "x.log"), "--scenario", str(tmp_path / "s.yaml"),
                "--out", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "no Megatron-LM, torchtitan or NeMo step line found" in r.stderr
    assert not (tmp_path / "p.json").exists()


# --- one cluster's logs predict its others ----------------------------------------------------------


def published_rows() -> dict[str, dict[str, str]]:
    with open(packaged_data_dir() / "training_runs.csv", newline="", encoding="utf-8") as fh:
        return {r["run_id"]: r for r in csv.DictReader(fh)}


def published(tmp_path: Path, group: str):
    """The predictable rows of one source group, as the validation harness builds them."""
    from simdist.validate.training import build_cases

    src = packaged_data_dir() / "training_runs.csv"
    with open(src, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source"] == group]
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "training_runs.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    shutil.copy(packaged_data_dir() / "breadth.csv", data / "breadth.csv")
    cases, _ = build_cases(data)
    shutil.rmtree(data)
    return cases


def calibrate(tmp_path: Path, logs: list[Path], scenarios: list[Path], fit: int):
    r = run_cli("calibrate", "--from-logs", *map(str, logs), *[x for s in scenarios for x in ("--scenario", str(s))],
                "--fit", str(fit), "--out", str(tmp_path / "p.json"), "--db", str(tmp_path / "runs.db"))
    assert r.returncode == 0, r.stderr + r.stdout
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith(("R0", "tt-"))}
    held = {name: float(cols[-1].rstrip("%")) / 100 for name, cols in rows.items() if cols[-1] != "-"}
    return json.loads((tmp_path / "p.json").read_text()), held


def test_megatron_logs_of_selene_predict_its_other_runs(tmp_path):
    cases = published(tmp_path, "Megatron-LM SC'21 weak scaling")
    assert len(cases) == 10
    logs = []
    for c in cases:
        m, p = c.scenario.model, c.scenario.plan
        args = {"global_batch_size": p.global_batch_size, "hidden_size": m.hidden_size,
                "micro_batch_size": p.micro_batch_size, "num_attention_heads": m.num_attention_heads,
                "num_layers": m.num_layers, "pipeline_model_parallel_size": p.pp, "seq_length": m.seq_length,
                "tensor_model_parallel_size": p.tp, "world_size": c.scenario.world_size,
                "num_layers_per_virtual_pipeline_stage": m.num_layers // (p.pp * p.virtual_pipeline_stages)
                if p.virtual_pipeline_stages > 1 else None}
        logs.append(tmp_path / f"{c.run_id}.log")
        logs[-1].write_text(megatron_log(args, with_warmup(c.measured_step_s)))
    base = {"name": "selene", "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 4, "gpus_per_node": 8},
            "model": {"num_layers": 24, "hidden_size": 2304, "num_attention_heads": 24, "vocab_size": 51200,
                      "seq_length": 2048, "mlp": "gelu", "bias": True, "position_embedding": "learned",
                      "tie_embeddings": True, "dropout": True},
            "plan": {"precision": "fp16", "recompute": "full", "global_batch_size": 512, "micro_batch_size": 8,
                     "flash_attention": False, "overlap_grad_reduce": False, "fp32_grad_accumulation": True}}
    (tmp_path / "selene.yaml").write_text(yaml.safe_dump(base))
    profile, held = calibrate(tmp_path, logs, [tmp_path / "selene.yaml"], fit=4)
    assert sorted(held) == [c.run_id for c in cases[4:]]  # 512 to 3072 GPUs, not fitted
    assert max(abs(e) for e in held.values()) < 0.10, held
    assert profile["error_band"] == pytest.approx(max(abs(e) for e in held.values()), abs=1e-3)
    assert profile["fitted_from"] == [c.run_id for c in cases[:4]]
    stored = RunStore(tmp_path / "runs.db").runs("measurement")
    assert [r.name for r in stored] == [c.run_id for c in cases]
    assert stored[0].payload["source"]["framework"] == "megatron" and stored[0].payload["steps"] == 9
    assert yaml.safe_load(stored[4].scenario_yaml)["plan"]["tp"] == cases[4].scenario.plan.tp


def test_torchtitan_logs_of_8_gpus_predict_128(tmp_path):
    rows = published_rows()
    logs, scenarios = [], []
    for rid, name, nodes in (("R0145", "tt-8gpu", 1), ("R0152", "tt-128gpu", 16)):
        r = rows[rid]
        assert r["framework"] == "torchtitan" and r["zero_stage_fsdp"].startswith("FSDP2")
        logs.append(tmp_path / f"{name}.log")
        logs[-1].write_text(titan_log(with_warmup(float(r["measured_tokens_per_s_per_gpu"])),
                                      float(r["measured_peak_mem_gib"])))
        sc = {"name": name, "model": {"preset": "llama3.1-8b"},  # torchtitan's llama3_8b: seq_len 8192
              "cluster": {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": 8},
              "plan": {"zero_stage": 3, "micro_batch_size": int(r["micro_batch"]),
                       "global_batch_size": int(r["global_batch"]), "precision": "bf16", "recompute": "selective"}}
        scenarios.append(tmp_path / f"{name}.yaml")
        scenarios[-1].write_text(yaml.safe_dump(sc))
    profile, held = calibrate(tmp_path, logs, scenarios, fit=1)
    assert list(held) == ["tt-128gpu"] and abs(held["tt-128gpu"]) < 0.10, held
    assert profile["residuals"]["gemm efficiency factor"] < 1.0  # 500 W HBM2e H100s run below the SXM peak


def test_nemo_logs_of_megatron_core_runs_predict_the_larger_ones(tmp_path):
    cases = published(tmp_path, "Megatron-Core H100 weak scaling (2024)")[:5]
    logs, scenarios = [], []
    for c in cases:
        logs.append(tmp_path / f"{c.run_id}.log")
        logs[-1].write_text(nemo_log(with_warmup(c.measured_step_s), c.scenario.plan.global_batch_size))
        scenarios.append(tmp_path / f"{c.run_id}.yaml")
        scenarios[-1].write_text(yaml.safe_dump(scenario_dict(c)))
    _, held = calibrate(tmp_path, logs, scenarios, fit=2)
    assert len(held) == 3 and max(abs(e) for e in held.values()) < 0.10, held


def scenario_dict(case) -> dict:
    """A case's scenario as a scenario-file dict (the fields the validation harness set)."""
    from simdist.validate.training import row_to_scenario_dict

    rows = published_rows()
    overrides = dict(t.split("=") for t in case.tuned)
    return row_to_scenario_dict(rows[case.run_id], {k: int(v) for k, v in overrides.items()})


def test_log_run_name_is_the_file_stem():
    assert LogRun("/x/y/R0001.log", "megatron").name == "R0001"
