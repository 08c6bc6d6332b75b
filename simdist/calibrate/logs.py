"""Training logs of Megatron-LM, Megatron-Bridge, torchtitan and NeMo, read into step times.

Pure text parsing (no framework imported); each reader knows its framework's line formats:

- **Megatron-LM** (``megatron/training/training.py: training_log``) and **Megatron-Bridge**
  (``megatron/bridge/training/utils/train_utils.py``, the same format)::

     [2024-05-01 10:00:00] iteration       20/     500 | consumed samples:        10240 |
     elapsed time per iteration (ms): 3528.0 | throughput per GPU (TFLOP/s/GPU): 137.0 |
     learning rate: 1.500000E-04 | global batch size:   512 | lm loss: 7.301230E+00 | ...

  (one line; some forks print ``elapsed time per iteration (ms): 3528.0/3530.2``, the second
  figure a running mean), the memory report ``[Rank 0] (after 20 iterations) memory (MB) |
  allocated: ... | max allocated: 61234.5 | reserved: ... | max reserved: ...``, and the
  arguments block (``------------------------ arguments ------------------------`` then
  ``  tensor_model_parallel_size ...................... 8``), from which the plan and model of the
  job are read (:data:`MEGATRON_ARGS`).
- **torchtitan** (``torchtitan/components/metrics.py``, colour codes stripped)::

     step: 20  loss:  7.8900  grad_norm:  1.2345  memory: 30.12GiB(31.70%)  tps: 6,789  tflops: 315.23  mfu: 31.87%

  ``tps`` is tokens per second per GPU, so a step lasts global batch x sequence / (tps x GPUs);
  ``memory`` is the peak reserved memory.
- **NeMo 2** (Lightning's console logger)::

     Training epoch 0, iteration 20/99 | lr: 1.499e-05 | global_batch_size: 128 | global_step: 20 |
     reduced_train_loss: 7.301 | train_step_timing in s: 2.345 | consumed_samples: 2688

  and NeMo 1's progress bar (``train_step_timing in s=3.130``, ``reduced_train_loss=0.0172``).

Every reader skips the warm-up: the first :data:`WARMUP_SHARE` of the logged steps (at least
one), whose times include compilation, allocator growth and the first data loads.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

WARMUP_SHARE = 0.1
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|")
_MEGATRON_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_LOSS = re.compile(r"\blm loss:\s*([-\d.Ee+]+)")
_MEGATRON_MEMORY = re.compile(r"memory \(MB\) \|.*?max allocated:\s*([\d.]+)")
_MEGATRON_ARG = re.compile(r"^\s*([a-z_][a-z0-9_]*) \.{2,}\s(.*)$")
_TITAN = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)"
                    r"(?:.*?tflops:\s*([\d,.]+))?")
_NEMO_STEP = re.compile(r"train_step_timing in s[:=]\s*([\d.]+)")
_NEMO_LOSS = re.compile(r"reduced_train_loss[:=]\s*([-\d.]+)")
_NEMO_ITER = re.compile(r"(?:global_step[:=]\s*([\d.]+)|iteration (\d+)/)")
_NEMO_TFLOPS = re.compile(r"tflops_per_sec_per_gpu[:=]\s*([\d.]+)")

# Megatron argument -> scenario field (plan.* or model.*), with its type
MEGATRON_ARGS: dict[str, tuple[str, type]] = {
    "tensor_model_parallel_size": ("plan.tp", int),
    "pipeline_model_parallel_size": ("plan.pp", int),
    "context_parallel_size": ("plan.cp", int),
    "micro_batch_size": ("plan.micro_batch_size", int),
    "global_batch_size": ("plan.global_batch_size", int),
    "num_layers": ("model.num_layers", int),
    "hidden_size": ("model.hidden_size", int),
    "num_attention_heads": ("model.num_attention_heads", int),
    "ffn_hidden_size": ("model.ffn_hidden_size", int),
    "seq_length": ("model.seq_length", int),
}


@dataclass
class LogRun:
    """What one training log says about its steps (after the warm-up)."""

    path: str
    framework: str  # megatron | torchtitan | nemo
    iterations: list[int] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)  # empty for torchtitan: from tps
    tokens_per_s_per_gpu: list[float] = field(default_factory=list)
    tflops_per_gpu: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    memory_gib: float | None = None  # peak per GPU as the framework reports it
    memory_kind: str = ""
    args: dict[str, str] = field(default_factory=dict)  # Megatron's arguments block

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def overrides(self) -> dict[str, object]:
        """Scenario fields the log states (Megatron's arguments), dotted key -> value."""
        out: dict[str, object] = {}
        for arg, (key, kind) in MEGATRON_ARGS.items():
            text = self.args.get(arg)
            if text is not None and text != "None":
                try:
                    out[key] = kind(text)
                except ValueError:
                    continue
        layers, per_chunk = self.args.get("num_layers"), self.args.get("num_layers_per_virtual_pipeline_stage")
        pp = out.get("plan.pp")
        if layers and per_chunk and per_chunk != "None" and isinstance(pp, int):
            out["plan.virtual_pipeline_stages"] = int(layers) // (pp * int(per_chunk))
        if self.args.get("world_size", "").isdigit():
            out["world_size"] = int(self.args["world_size"])
        return out


def _skip_warmup(values: list[float]) -> list[float]:
    if len(values) < 2:
        return values
    return values[max(1, round(len(values) * WARMUP_SHARE)):]


def detect(text: str) -> str | None:
    """Which framework wrote ``text`` (None when no step line of a known one is in it)."""
    if _MEGATRON_TIME.search(text):
        return "megatron"
    if _TITAN.search(_ANSI.sub("", text)):
        return "torchtitan"
    if _NEMO_STEP.search(text):
        return "nemo"
    return None


def parse_log(path: str | Path, text: str | None = None) -> LogRun:
    """Read one log; ValueError (naming the file) when no known step line is in it."""
    raw = Path(path).read_text(encoding="utf-8", errors="replace") if text is None else text
    kind = detect(raw)
    if kind is None:
        raise ValueError(f"{path}: no Megatron-LM, torchtitan or NeMo step line found (see simdist.calibrate.logs "
                         "for the formats read)")
    run = LogRun(str(path), kind)
    reader = {"megatron": _megatron, "torchtitan": _torchtitan, "nemo": _nemo}[kind]
    reader(raw, run)
    return run


def _megatron(text: str, run: LogRun) -> None:
    times, tflops, losses, iters = [], [], [], []
    in_args = False
    for line in text.splitlines():
        if "arguments" in line and line.strip().startswith("---"):
            in_args = "end of arguments" not in line
            continue
        if in_args:
            m = _MEGATRON_ARG.match(line)
            if m:
                run.args[m.group(1)] = m.group(2).strip()
            continue
        t = _MEGATRON_TIME.search(line)
        if t and (it := _MEGATRON_ITER.search(line)):
            iters.append(int(it.group(1)))
            times.append(float(t.group(1)) / 1e3)
            if f := _MEGATRON_TFLOPS.search(line):
                tflops.append(float(f.group(1)))
            if loss := _MEGATRON_LOSS.search(line):
                losses.append(float(loss.group(1)))
        elif mem := _MEGATRON_MEMORY.search(line):
            peak = float(mem.group(1)) / 1024
            run.memory_gib = max(run.memory_gib or 0.0, peak)
            run.memory_kind = "max allocated"
    skip = len(times) - len(_skip_warmup(times))
    run.iterations, run.step_times_s = iters[skip:], times[skip:]
    run.tflops_per_gpu, run.losses = tflops[skip:] if len(tflops) == len(times) else tflops, losses[skip:]


def _torchtitan(text: str, run: LogRun) -> None:
    steps, tps, tflops, losses = [], [], [], []
    for line in _ANSI.sub("", text).splitlines():
        m = _TITAN.search(line)
        if not m:
            continue
        steps.append(int(m.group(1)))
        losses.append(float(m.group(2)))
        run.memory_gib = max(run.memory_gib or 0.0, float(m.group(3)))
        run.memory_kind = "max reserved"
        tps.append(float(m.group(4).replace(",", "")))
        if m.group(5):
            tflops.append(float(m.group(5).replace(",", "")))
    skip = len(tps) - len(_skip_warmup(tps))
    run.iterations, run.tokens_per_s_per_gpu = steps[skip:], tps[skip:]
    run.losses, run.tflops_per_gpu = losses[skip:], tflops[skip:]


def _nemo(text: str, run: LogRun) -> None:
    steps, times, losses, tflops = [], [], [], []
    for line in text.splitlines():
        t = _NEMO_STEP.search(line)
        if not t:
            continue
        times.append(float(t.group(1)))
        it = _NEMO_ITER.search(line)
        steps.append(int(float(it.group(1) or it.group(2))) if it else len(steps))
        if loss := _NEMO_LOSS.search(line):
            losses.append(float(loss.group(1)))
        if f := _NEMO_TFLOPS.search(line):
            tflops.append(float(f.group(1)))
    skip = len(times) - len(_skip_warmup(times))
    run.iterations, run.step_times_s, run.losses = steps[skip:], times[skip:], losses[skip:]
    run.tflops_per_gpu = tflops[skip:]


def median_step(run: LogRun, tokens_per_step: float, world_size: int) -> list[float]:
    """Step times of the log in seconds (torchtitan: from tokens per second per GPU)."""
    if run.step_times_s:
        return list(run.step_times_s)
    return [tokens_per_step / (tps * world_size) for tps in run.tokens_per_s_per_gpu if tps > 0]


def spread(times: list[float]) -> float:
    if len(times) < 2:
        return 0.0
    mid = statistics.median(times)
    return (max(times) - min(times)) / mid if mid else 0.0
