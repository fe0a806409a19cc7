"""Mixture-of-experts pieces written in pure torch: two router families, token dispatch by sort and
index, and decoder-only MoE language models built on zoo_layers.

Routers (both return, per token, the chosen experts, their gates and an auxiliary loss or None):
  SigmoidTopKRouter  DeepSeek-V3's: scores s = sigmoid(x W^T) in fp32; the top-k experts of s + b
                     (b a bias buffer that only steers selection: aux-loss-free balancing; it stays
                     zero here because updating it between steps is the trainer's business); gates =
                     the chosen scores normalised to sum 1, times a scaling factor; plus the
                     complementary sequence-wise balance loss alpha * sum_i f_i * P_i.
  SoftmaxTopKRouter  Qwen3-MoE's: softmax over experts in fp32, top-k, gates renormalised to sum 1
                     (norm_topk_prob); no auxiliary loss (Hugging Face's default without router logits).

Dispatch (dispatch_and_combine): the (token, expert) assignments are sorted by expert (a stable sort),
the tokens gathered with index_select into one contiguous slab, each expert runs on its slice, and the
weighted results are added back per token with index_add_. No expert parallelism. The ops are chosen
so that torch.use_deterministic_algorithms(True) has a deterministic CUDA implementation of each:
index_select (backward: index_add), index_add_, gather (backward: scatter_add), sort, bincount
without weights, topk (indices only; no gradient goes through it). torch's documentation lists
index_add, scatter_add_ and gather-with-grad among the ops that "act deterministically" in that mode
on recent torch; on the CPU they are deterministic anyway (checked by the CPU tests). That the CUDA
losses repeat bit for bit must be checked on the GPU.
"""

import torch
from torch import nn
import torch.nn.functional as F

from zoo_layers import Attention, DecoderLM, DecoderStack, RMSNorm, SwiGLU, init_weights


def dispatch_and_combine(tokens, chosen, gates, experts):
    """sum_j gates[t, j] * experts[chosen[t, j]](tokens[t]) for every token t.

    tokens (T, hidden), chosen (T, k) expert indices, gates (T, k). One host synchronisation (the
    per-expert counts, to split the slab), as DeepSeek's and Hugging Face's implementations have."""
    count, hidden = tokens.shape
    top_k = chosen.size(1)
    assignment_expert = chosen.reshape(-1)
    order = torch.sort(assignment_expert, stable=True).indices
    token_of = torch.div(order, top_k, rounding_mode="floor")
    per_expert = torch.bincount(assignment_expert, minlength=len(experts)).tolist()
    routed_in = tokens.index_select(0, token_of)
    gate_of = gates.reshape(-1).index_select(0, order)
    outputs = [expert(chunk) for expert, chunk in zip(experts, routed_in.split(per_expert)) if chunk.size(0)]
    routed_out = torch.cat(outputs) * gate_of.unsqueeze(1).to(tokens.dtype)
    return tokens.new_zeros(count, hidden).index_add_(0, token_of, routed_out)


class SigmoidTopKRouter(nn.Module):
    """DeepSeek-V3 routing (see the module docstring)."""

    def __init__(self, hidden, experts, top_k, scaling=1.0, balance_alpha=1e-4):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden).normal_(0.0, 0.02))
        self.register_buffer("selection_bias", torch.zeros(experts))
        self.experts = experts
        self.top_k = top_k
        self.scaling = scaling
        self.balance_alpha = balance_alpha

    def forward(self, tokens, batch):
        scores = torch.sigmoid(F.linear(tokens.float(), self.weight.float()))
        chosen = torch.topk(scores + self.selection_bias, self.top_k, dim=-1).indices
        gates = scores.gather(1, chosen)
        gates = gates / (gates.sum(-1, keepdim=True) + 1e-20) * self.scaling
        aux = None
        if self.training and self.balance_alpha > 0:
            aux = self.balance_alpha * sequence_balance_loss(scores, chosen, batch, self.experts, self.top_k)
        return chosen, gates, aux


def sequence_balance_loss(scores, chosen, batch, experts, top_k):
    """DeepSeek-V3's complementary sequence-wise balance loss, without alpha: per sequence,
    sum_i f_i * P_i with f_i = experts / (top_k * seq) * (tokens choosing i) and P_i the mean over the
    sequence of the normalised scores s_i / sum_j s_j; averaged over the batch."""
    seq = scores.size(0) // batch
    normalised = scores / scores.sum(-1, keepdim=True)
    mean_score = normalised.view(batch, seq, experts).mean(1)
    with torch.no_grad():
        chosen_count = F.one_hot(chosen.view(batch, seq * top_k), experts).sum(1).to(scores.dtype)
        fraction = chosen_count * (experts / (top_k * seq))
    return (fraction * mean_score).sum(-1).mean()


class SoftmaxTopKRouter(nn.Module):
    """Qwen3-MoE routing (see the module docstring)."""

    def __init__(self, hidden, experts, top_k, normalise=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden).normal_(0.0, 0.02))
        self.top_k = top_k
        self.normalise = normalise

    def forward(self, tokens, batch):
        probabilities = torch.softmax(F.linear(tokens, self.weight).float(), dim=-1)
        chosen = torch.topk(probabilities, self.top_k, dim=-1).indices
        gates = probabilities.gather(1, chosen)
        if self.normalise:
            gates = gates / gates.sum(-1, keepdim=True)
        return chosen, gates, None


class MoEBlock(nn.Module):
    """A router, routed experts (SwiGLU each) and optionally shared experts that every token passes
    through (one SwiGLU of shared_ffn width). Returns (output, aux_loss or None)."""

    def __init__(self, hidden, router, experts, expert_ffn, shared_ffn=0):
        super().__init__()
        self.router = router
        self.experts = nn.ModuleList(SwiGLU(hidden, expert_ffn) for _ in range(experts))
        self.shared_expert = SwiGLU(hidden, shared_ffn) if shared_ffn else None

    def forward(self, x):
        batch, seq, hidden = x.shape
        tokens = x.reshape(batch * seq, hidden)
        chosen, gates, aux = self.router(tokens, batch)
        out = dispatch_and_combine(tokens, chosen, gates, self.experts)
        if self.shared_expert is not None:
            out = out + self.shared_expert(tokens)
        return out.view(batch, seq, hidden), aux


class MoEDecoderLayer(nn.Module):
    """Pre-norm attention, then pre-norm MoE, each with a residual add."""

    def __init__(self, hidden, heads, kv_heads, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = moe

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        moe_out, aux = self.mlp(self.post_attention_layernorm(x))
        return x + moe_out, aux


# DeepSeek-style names: --offload-modules and actpage policies match module class names.
class DeepSeekMoEBlock(MoEBlock):
    pass


class DeepSeekDecoderLayer(MoEDecoderLayer):
    pass


class DeepSeekModel(DecoderStack):
    pass


class DeepSeekForCausalLM(DecoderLM):
    pass


def deepseek_moe(vocab, hidden, layers, heads, experts, top_k, expert_ffn, shared_experts, scaling=1.0,
                 balance_alpha=1e-4):
    """A DeepSeek-style MoE LM (standard multi-head attention, not MLA; every layer MoE), fp32, in
    train mode, random init (seed the generator before calling)."""
    def block():
        router = SigmoidTopKRouter(hidden, experts, top_k, scaling, balance_alpha)
        return DeepSeekMoEBlock(hidden, router, experts, expert_ffn, shared_ffn=shared_experts * expert_ffn)

    stack = DeepSeekModel(vocab, hidden, [DeepSeekDecoderLayer(hidden, heads, heads, block()) for _ in range(layers)],
                          head_dim=hidden // heads)
    return init_weights(DeepSeekForCausalLM(stack, vocab, hidden)).train()
