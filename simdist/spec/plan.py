"""ParallelPlan: how the model is split and trained, plus the one rank grid.

The rank grid maps a global rank to its (dp, pp, cp, tp) coordinates with tp innermost, so a
tensor-parallel group sits inside one node; the simulator and the executor both use it. With
expert parallelism the pipeline stages are outermost (``ParallelPlan.pipeline_outermost``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

from simdist.errors import Problem
from simdist.frozen import frozen
from simdist.spec.fields import hash_once, spec_field, validate
from simdist.spec.stages import layout_problems

# The allowed values of each choice field: the Literal types are the single source.
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "dualpipe", "dualpipev"]
Recompute = Literal["none", "selective", "full"]
Precision = Literal["fp32", "fp16", "bf16", "fp8"]
Optimizer = Literal["adam", "adamw", "sgd", "lamb", "lars", "adafactor"]
GradientSync = Literal["allreduce", "parameter-server", "async-parameter-server"]
OffloadDevice = Literal["none", "cpu", "nvme"]
CompressionMethod = Literal["none", "fp16", "bf16", "int8", "topk", "powersgd"]
Zero3Fetch = Literal["layer", "module", "module_sync"]
ZeroStage = Literal[0, 1, 2, 3]
MoeDispatcher = Literal["alltoall", "allgather", "flex"]
CpMethod = Literal["ring", "allgather", "ulysses"]
Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"]
Framework = Literal["megatron", "pytorch", "deepspeed", "torchtitan", "nemo"]
AttentionKernel = Literal["flash2", "cudnn", "triton"]
ExpertBias = Literal["per_expert", "fused"]
Axis = Literal["tp", "cp", "pp", "dp", "dp_shard", "dp_replica"]

SCHEDULES: tuple[str, ...] = get_args(Schedule)
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
GRADIENT_SYNC: tuple[str, ...] = get_args(GradientSync)
OFFLOAD_DEVICES: tuple[str, ...] = get_args(OffloadDevice)
COMPRESSION_METHODS: tuple[str, ...] = get_args(CompressionMethod)
AXES: tuple[str, ...] = get_args(Axis)
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)
CP_METHODS: tuple[str, ...] = get_args(CpMethod)
DUALPIPE_SCHEDULES = ("dualpipe", "dualpipev")


def _offload_shorthand(v: object) -> object:
    return {} if v == "none" else v


def _compression_shorthand(v: object) -> object:
    return {"method": v} if isinstance(v, str) else v


@frozen(kw_only=True)
class Offload:
    optimizer: OffloadDevice = spec_field("none", doc="where the optimizer states and step live")
    params: OffloadDevice = spec_field("none", doc="where the parameters live between uses (ZeRO-3)")

    def __post_init__(self) -> None:
        validate(self)

    @property
    def any(self) -> bool:
        return self.optimizer != "none" or self.params != "none"


@frozen(kw_only=True)
class GradCompression:
    method: CompressionMethod = spec_field("none", yaml_required=True, doc="gradient compression")
    ratio: float = spec_field(0.01, check="fraction", doc="top-k: fraction of gradient entries sent")
    rank: int = spec_field(4, check="positive", doc="PowerSGD rank")
    error_feedback: bool = spec_field(True, doc="carry the compression error into the next step")

    def __post_init__(self) -> None:
        validate(self)

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@hash_once
@frozen(kw_only=True)
class ParallelPlan:
    tp: int = spec_field(1, check="positive", doc="tensor-parallel degree")
    pp: int = spec_field(1, check="positive", doc="pipeline stages")
    dp: int = spec_field(1, check="positive", doc="data-parallel degree; default GPUs / (tp*pp*cp)")
    cp: int = spec_field(1, check="positive", doc="context-parallel degree (sequence split)")
    virtual_pipeline_stages: int = spec_field(1, check="positive", doc="model chunks per pipeline stage")
    schedule: Schedule = spec_field("1f1b", doc="pipeline schedule")
    zero_stage: ZeroStage = spec_field(0, doc="ZeRO stage: 1 optimizer, 2 + gradients, 3 + parameters")
    sequence_parallel: bool = spec_field(False, doc="Megatron sequence parallelism (with tp)")
    recompute: Recompute = spec_field("none", doc="activation recomputation")
    micro_batch_size: int = spec_field(1, check="positive", doc="sequences per micro-batch")
    global_batch_size: int = spec_field(check="positive", doc="sequences per optimizer step")
    precision: Precision = spec_field("bf16", doc="training precision")
    optimizer: Optimizer = spec_field("adam", doc="optimizer (sets the optimizer-state bytes)")
    fp32_grad_accumulation: bool = spec_field(False, doc="fp32 main_grad buffer (Megatron)")
    flash_attention: bool = spec_field(True, doc="fused attention: no s^2 activations, one kernel")
    overlap_grad_reduce: bool = spec_field(True, doc="DP gradient sync overlaps backward (DDP buckets)")
    overlap_param_gather: bool = spec_field(True, doc="ZeRO-3/FSDP prefetches the next layer's parameters")
    tp_comm_overlap: bool = spec_field(False, doc="TP collectives overlapped with GEMMs (Megatron-Core/TE)")
    # ZeRO-3 gather unit: "layer" (FSDP wraps each block: one collective per layer and pass),
    # "module" (DeepSpeed ZeRO-3: each submodule's own, at collectives.DEEPSPEED_ZERO3_BUSBW) or
    # "module_sync" (DeepSpeed <= 0.4.0, one submodule ahead, device synced: analytic.zero3_sync)
    zero3_fetch: Zero3Fetch = spec_field("layer", doc="ZeRO-3 gather unit: layer (FSDP), module (DeepSpeed) "
                                         "or module_sync (DeepSpeed <= 0.4.0)")
    # v1.1
    dp_shard: int = spec_field(0, check="positive", since="1.1", doc="HSDP shard group size; default dp")
    zero_quantized_weights: bool = spec_field(False, since="1.1", doc="ZeRO++ qwZ: int8 parameter all-gather")
    offload: Offload = spec_field(default_factory=Offload, since="1.1", shorthand=_offload_shorthand,
                                  null_is_default=True, doc="ZeRO-Offload / ZeRO-Infinity / FSDP CPU offload")
    gradient_sync: GradientSync = spec_field("allreduce", since="1.1", doc="collectives or parameter servers")
    parameter_servers: int = spec_field(0, check="positive", since="1.1", doc="servers; default one per node")
    grad_compression: GradCompression = spec_field(default_factory=GradCompression, since="1.1",
                                                   shorthand=_compression_shorthand, null_is_default=True,
                                                   doc="gradient compression of the DP sync")
    ddp_bucket_size_bytes: float = spec_field(25 * 2**20, key="ddp_bucket_size", unit="size", check="positive",
                                              since="1.1", doc="DDP gradient bucket / tensor-fusion buffer")
    # v1.2
    ep: int = spec_field(1, check="positive", since="1.2", doc="expert-parallel size, carved out of the tp*cp*dp ranks of a stage")
    etp: int = spec_field(1, check="positive", since="1.2", doc="expert tensor-parallel size")
    moe_dispatcher: MoeDispatcher = spec_field("alltoall", since="1.2",
                                               doc="token dispatch: alltoall, allgather, or flex (DeepEP/HybridEP: "
                                                   "each token crosses to another node once)")
    cp_method: CpMethod = spec_field("ring", since="1.2", doc="context parallelism: ring, allgather or ulysses")
    ep_comm_overlap: bool = spec_field(False, since="1.2",
                                       doc="expert all-to-all hidden behind another micro-batch's compute "
                                           "(Megatron-Core's --overlap-moe-expert-parallel-comm)")
    fp8_recipe: Fp8Recipe | None = spec_field(None, since="1.2",
                                              doc="FP8 scaling recipe (precision fp8); default Transformer Engine's")
    framework: Framework | None = spec_field(None, since="1.2", doc="whose defaults fill unset fields")
    attention_kernel: AttentionKernel | None = spec_field(
        None, since="1.2", doc="fused attention kernel class (flash_attention): flash2 (FlashAttention-2, SDPA), "
                               "cudnn (Transformer Engine's cuDNN fused attention), triton (FlashAttention in "
                               "Triton); default the framework's")
    fused_elementwise: bool | None = spec_field(
        None, since="1.2", doc="elementwise ops (norms, RoPE, activations) in fused kernels (Transformer Engine, "
                               "torch.compile) or eager, one kernel per op; default the framework's")
    recompute_early_stop: bool | None = spec_field(
        None, since="1.2", doc="full recompute stops once backward's tensors are back (PyTorch's non-reentrant "
                               "checkpoint): a 16-bit down-projection is not rerun; default the framework's")
    moe_expert_bias: ExpertBias | None = spec_field(None, since="1.2", doc="the experts' output bias (models with bias): per_expert "
                                                    "(a multiply and an add per local expert) or fused; default the framework's")
    zero_hpz_partition_size: int = spec_field(0, check="positive", since="1.2",
                                              doc="ZeRO++ hpZ: secondary weight copy sharded in groups of this size")
    pipeline_layout: str | None = spec_field(None, since="1.2", doc="Megatron-Core pipeline layout, e.g. "
                                             "Et|(tt|)*30mL (simdist.spec.stages); default an even split")
    grad_accumulation_fusion: bool | None = spec_field(
        None, since="1.2", doc="the weight-gradient GEMM adds into the kept gradient (Megatron), or autograd "
                               "adds later micro-batches' in a pass of their own; default the framework's")

    def __post_init__(self) -> None:
        validate(self)
        if self.dp_shard == 0:
            object.__setattr__(self, "dp_shard", self.dp)

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        return self.dp * self.model_parallel_size

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline (per DP replica) in one optimizer step."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def dp_replicas(self) -> int:
        """Number of replica groups in hybrid sharding (1 = plain full sharding)."""
        return self.dp // self.dp_shard

    # --- what the rest of the code keeps asking, answered once ---

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation or working weight: 4 in fp32 training, else 2 (FP8 GEMMs
        read transient casts of 16-bit tensors)."""
        return 4 if self.precision == "fp32" else 2

    @property
    def mixed_precision(self) -> bool:
        """16-bit (or FP8) compute with an fp32 master copy of the weights (Micikevicius et al.
        2018); fp32 training updates its weights in place."""
        return self.precision != "fp32"

    @property
    def grad_buffer_bytes(self) -> int:
        """Bytes per gradient in the accumulation buffer: fp32 in fp32 training or with
        Megatron's main_grad accumulation, else the 16-bit gradients the ZeRO paper counts."""
        return 4 if self.precision == "fp32" or self.fp32_grad_accumulation else 2

    @property
    def shards_optimizer(self) -> bool:
        """ZeRO-1 and above: optimizer states partitioned over the shard group."""
        return self.zero_stage >= 1

    @property
    def shards_gradients(self) -> bool:
        """ZeRO-2 and above: gradients reduce-scattered every micro-batch and kept sharded."""
        return self.zero_stage >= 2

    @property
    def shards_params(self) -> bool:
        """ZeRO-3 / FSDP FULL_SHARD: parameters sharded and gathered layer by layer."""
        return self.zero_stage == 3

    @property
    def hybrid_sharding(self) -> bool:
        """HSDP / FSDP HYBRID_SHARD: shards inside groups of dp_shard, replicas across them."""
        return self.dp_shard < self.dp

    @property
    def shard_axis(self) -> Axis:
        """The axis ZeRO/FSDP shards over: the shard group under hybrid sharding, else dp."""
        return "dp_shard" if self.hybrid_sharding else "dp"

    @property
    def uses_parameter_servers(self) -> bool:
        return self.gradient_sync != "allreduce"

    @property
    def sync_parameter_servers(self) -> bool:
        return self.gradient_sync == "parameter-server"

    @property
    def async_parameter_servers(self) -> bool:
        return self.gradient_sync == "async-parameter-server"

    @property
    def interleaved(self) -> bool:
        return self.schedule == "interleaved-1f1b"

    @property
    def split_backward(self) -> bool:
        """Zero-bubble schedules split backward into input-gradient (B) and weight-gradient (W)."""
        return self.schedule == "zero-bubble"

    def axis_size(self, axis: str) -> int:
        """Ranks in one group along ``axis``."""
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp,
                "dp_shard": self.dp_shard, "dp_replica": self.dp_replicas}[axis]

    def axis_stride(self, axis: str) -> int:
        """Rank distance between neighbours of a group (rank grid: tp innermost, then cp, pp, dp;
        with experts, ``pipeline_outermost``: tp, cp, dp, pp)."""
        if self.pipeline_outermost:
            dp, pp = self.tp * self.cp, self.tp * self.cp * self.dp
        else:
            dp, pp = self.tp * self.cp * self.pp, self.tp * self.cp
        return {"tp": 1, "cp": self.tp, "pp": pp, "dp": dp, "dp_shard": dp,
                "dp_replica": dp * self.dp_shard}[axis]

    @property
    def pipeline_outermost(self) -> bool:
        """Ranks ordered tp, cp, dp, pp (Megatron-Core's default order "tp-cp-ep-dp-pp") rather
        than tp, cp, pp, dp: with expert parallelism, so that an expert-parallel group (carved
        out of the data-parallel ranks of one stage) takes consecutive ranks, inside a node
        when it fits there, as Megatron-Core places it."""
        return self.ep > 1

    # --- v1.2 ---

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert weights: Megatron-Core lays experts over
        etp * ep ranks of one pipeline stage's tp * cp * dp, the rest replicate them
        (parallel_state: expert_data_parallel_size = world / (etp * ep * pp))."""
        return max(1, self.tp * self.cp * self.dp // (self.etp * self.ep))

    @property
    def dualpipe(self) -> bool:
        """DualPipe / DualPipeV (DeepSeek-V3): two pipelines fed from both ends."""
        return self.schedule in DUALPIPE_SCHEDULES

    def problems(self) -> list[Problem]:
        """What the plan's own fields contradict (names relative to ``plan``); the checks that
        need the model or the cluster are in :mod:`simdist.spec.consistency`."""
        out: list[Problem] = []

        def add(f: str, msg: str) -> None:
            out.append(Problem(f, msg))

        v, sched = self.virtual_pipeline_stages, self.schedule
        if v > 1 and sched != "interleaved-1f1b":
            add("virtual_pipeline_stages", f"{v} chunks per stage needs schedule interleaved-1f1b, not {sched}")
        elif sched == "interleaved-1f1b" and v == 1:
            add("schedule", "interleaved-1f1b needs virtual_pipeline_stages >= 2")
        if v > 1 and self.pp == 1:
            add("virtual_pipeline_stages", "needs pp > 1")
        per_step = self.micro_batch_size * self.dp
        if self.global_batch_size % per_step:
            add("global_batch_size", f"{self.global_batch_size} is not a multiple of micro_batch_size*dp "
                f"= {self.micro_batch_size}*{self.dp} = {per_step}")
        elif sched == "interleaved-1f1b" and self.num_microbatches % self.pp:
            add("global_batch_size", f"interleaved-1f1b needs the micro-batches per pipeline "
                f"({self.num_microbatches}) to be a multiple of pp ({self.pp})")
        elif self.dualpipe:
            self._dualpipe_problems(add)
        if self.dp % self.dp_shard:
            add("dp_shard", f"{self.dp_shard} does not divide dp ({self.dp})")
        self._sharding_problems(add)
        if self.grad_compression.enabled and self.shards_gradients and self.grad_compression.method in ("topk", "powersgd"):
            add("grad_compression.method", f"{self.grad_compression.method} compresses a replicated "
                "gradient all-reduce; it does not combine with zero_stage >= 2 (sharded gradients)")
        if sched == "zero-bubble" and v > 1:
            add("schedule", "zero-bubble runs one chunk per stage (virtual_pipeline_stages 1)")
        if self.pipeline_layout is not None:
            for msg in ["not with dualpipe/dualpipev (their stages are fixed)"] if self.dualpipe else \
                    layout_problems(self.pipeline_layout, self.pp * v):
                add("pipeline_layout", msg)
        if self.fp8_recipe is not None and self.precision != "fp8":
            add("fp8_recipe", f"only applies with precision fp8, not {self.precision}")
        if self.attention_kernel is not None and not self.flash_attention:
            add("attention_kernel", "only applies with flash_attention true")
        if (self.tp * self.cp * self.dp) % (self.etp * self.ep):
            what = "etp" if self.etp > 1 else "ep"
            add(what, f"etp*ep = {self.etp}*{self.ep} does not divide the tp*cp*dp = "
                f"{self.tp * self.cp * self.dp} ranks of a pipeline stage (Megatron-Core lays the experts "
                "over them: MoE parallel folding)")
        return out

    def _dualpipe_problems(self, add: Callable[[str, str], None]) -> None:
        """DeepSeek's DualPipe needs an even number of pipeline ranks and an even number of at
        least 2*pp micro-batches (deepseek-ai/DualPipe, dualpipe.py step()); DualPipeV (PyTorch
        ScheduleDualPipeV) holds two stages per rank and needs micro-batches >= 2*pp."""
        pp, m = self.pp, self.num_microbatches
        if self.schedule == "dualpipe" and pp % 2:
            add("pp", f"dualpipe needs an even number of pipeline stages, got {pp}")
        if m < 2 * pp or (self.schedule == "dualpipe" and m % 2):
            even = "an even number of " if self.schedule == "dualpipe" else ""
            add("global_batch_size", f"{self.schedule} needs {even}at least 2*pp = {2 * pp} micro-batches "
                f"per pipeline, got {m}")

    def _sharding_problems(self, add: Callable[[str, str], None]) -> None:
        if self.uses_parameter_servers and self.zero_stage:
            add("gradient_sync", f"{self.gradient_sync} keeps whole parameters on the servers; "
                "use zero_stage 0 with it")
        if self.offload.params != "none" and self.zero_stage != 3:
            add("offload.params", "parameter offload needs zero_stage 3 (ZeRO-Infinity / FSDP offload)")
        if self.offload.optimizer != "none" and self.zero_stage == 0 and self.dp > 1:
            add("offload.optimizer", "optimizer offload needs zero_stage >= 1 (ZeRO-Offload partitions "
                "the optimizer across DP ranks)")
        if self.zero_quantized_weights and self.zero_stage != 3:
            add("zero_quantized_weights", "quantized weight all-gather (ZeRO++ qwZ) needs zero_stage 3")
        hpz = self.zero_hpz_partition_size
        if hpz > 1:
            if self.zero_stage != 3:
                add("zero_hpz_partition_size", "the secondary weight partition (ZeRO++ hpZ) needs zero_stage 3")
            elif self.dp % hpz:
                add("zero_hpz_partition_size", f"{hpz} does not divide dp ({self.dp})")
            elif self.hybrid_sharding:
                add("zero_hpz_partition_size", "combines with dp_shard < dp (HSDP) in no framework; choose one")


def unchecked_replace(plan: ParallelPlan, **changes: Any) -> ParallelPlan:
    """``dataclasses.replace(plan, **changes)`` without the field checks of ``__post_init__``
    (about 0.1 ms, a search's plans have values of the right types and ranges already); the
    changes must name fields, and ``dp_shard`` is taken as given (no default from dp)."""
    out = object.__new__(ParallelPlan)
    state = plan.__getstate__()  # without the kept hash (simdist.spec.fields.hash_once)
    unknown = set(changes) - state.keys()
    if unknown:
        raise TypeError(f"not fields of ParallelPlan: {sorted(unknown)}")
    state.update(changes)
    out.__dict__.update(state)
    return out


class RankCoord(NamedTuple):
    dp: int
    pp: int
    cp: int
    tp: int


def rank_coord(rank: int, plan: ParallelPlan) -> RankCoord:
    """(dp, pp, cp, tp) of ``rank``; tp varies fastest, then cp, then pp, then dp (dp before pp
    when ``plan.pipeline_outermost``)."""
    tp = rank % plan.tp
    rest = rank // plan.tp
    cp = rest % plan.cp
    rest //= plan.cp
    if plan.pipeline_outermost:
        return RankCoord(rest % plan.dp, rest // plan.dp, cp, tp)
    pp = rest % plan.pp
    dp = rest // plan.pp
    return RankCoord(dp, pp, cp, tp)


def rank_of(coord: RankCoord, plan: ParallelPlan) -> int:
    if plan.pipeline_outermost:
        return ((coord.pp * plan.dp + coord.dp) * plan.cp + coord.cp) * plan.tp + coord.tp
    return ((coord.dp * plan.pp + coord.pp) * plan.cp + coord.cp) * plan.tp + coord.tp
