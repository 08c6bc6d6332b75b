"""An independent parameter count of a ModelSpec, written from the architectures' papers, to
check that catalog presets and imported configs carry the published figures (the simulator's
own count, simdist.analytic.params, learns the v1.2 fields separately).

- attention: Q and O projections of heads * head_dim, K and V of kv_heads * head_dim (GQA);
  multi-head latent attention (DeepSeek-V2 paper, arXiv:2405.04434 sec. 2.1): W_DQ (hidden x
  q_lora_rank) + its RMSNorm + W_UQ/W_QR (q_lora_rank x heads*(head_dim+rope)), W_DKV+W_KR
  (hidden x (kv_lora_rank+rope)) + its RMSNorm, W_UK/W_UV (kv_lora_rank x heads*(head_dim+v)),
  W_O (heads*v x hidden);
- FFN: 2 (GELU) or 3 (SwiGLU) matrices of hidden x width; MoE layers: a router (hidden x
  experts), the routed experts and the shared ones, each an FFN of moe_ffn_hidden_size;
- biases where the model has them (GPT-OSS: attention and experts, router too), two norms per
  layer and a final one, the embedding and an untied LM head. Multi-token prediction modules
  are left out, as DeepSeek-V3's published 671B leaves them out.
"""

from simdist.spec.model import ModelSpec


def attention_params(m: ModelSpec) -> int:
    h, a, d = m.hidden_size, m.num_attention_heads, m.head_dim
    if m.attention == "mla":
        r, v = m.qk_rope_head_dim, m.v_head_dim
        q = h * a * (d + r) if not m.q_lora_rank else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * (d + r)
        kv = h * (m.kv_lora_rank + r) + m.kv_lora_rank + m.kv_lora_rank * a * (d + v)
        return q + kv + a * v * h
    kv = m.num_kv_heads * d
    weights = 2 * h * a * d + 2 * h * kv
    return weights + ((a * d + 2 * kv + h) if m.bias else 0)


def ffn_params(m: ModelSpec, width: int) -> int:
    n = 3 if m.mlp == "swiglu" else 2
    bias = ((n - 1) * width + m.hidden_size) if m.bias else 0
    return n * m.hidden_size * width + bias


def total_params(m: ModelSpec) -> int:
    h = m.hidden_size
    dense = ffn_params(m, m.ffn_hidden_size)
    moe = 0
    if m.is_moe:
        experts = m.num_experts + m.num_shared_experts
        moe = experts * ffn_params(m, m.moe_ffn_hidden_size) + h * m.num_experts + (m.num_experts if m.bias else 0)
    dense_layers = m.num_layers - m.moe_layers
    layers = m.num_layers * (attention_params(m) + 2 * h) + dense_layers * dense + m.moe_layers * moe
    embeddings = m.vocab_size * h * (1 if m.tie_embeddings else 2)
    return layers + embeddings + h
