"""Pure-torch building blocks of the zoo's own models (the DeepSeek-style MoE) and of the tiny
stand-ins for Hugging Face models (tiny_models.py): RMSNorm, rotary embeddings, causal attention,
SwiGLU, and a decoder-only language model skeleton with Hugging Face's interface
(`forward(input_ids, labels) -> output with .loss`, `gradient_checkpointing_enable()`,
`model.layers`, `lm_head`).

Runs on torch 1.13 (the CPU test machine: no F.scaled_dot_product_attention, no nn.RMSNorm) and on
torch 2.x (SDPA is used where it exists).
"""

import math

import torch
from torch import nn
import torch.nn.functional as F
import torch.utils.checkpoint


def causal_attention(q, k, v):
    """Causal self-attention of (batch, heads, seq, head_dim) tensors: SDPA where torch has it (flash
    or memory-efficient kernels on the GPU), else the same computation written out (torch < 2.0)."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    seq = q.size(-2)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 and cast back, as Llama's."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables of rotary position embeddings (theta 10000) for a sequence length."""

    def __init__(self, head_dim, theta=10000.0):
        super().__init__()
        inverse = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inverse_frequency", inverse, persistent=False)

    def forward(self, seq, dtype):
        positions = torch.arange(seq, device=self.inverse_frequency.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inverse_frequency.float())
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with rotary embeddings; q/k/v/o
    projections named as in Hugging Face's Llama."""

    def __init__(self, hidden, heads, kv_heads=None, head_dim=None):
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads or heads
        self.head_dim = head_dim or hidden // heads
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        out = causal_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): Llama's MLP, and each expert of the MoE models."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ModelOutput(dict):
    """A dict whose keys read as attributes too (Hugging Face's outputs are both; the Trainer indexes
    outputs["loss"], the zoo's loops read .loss)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name)


def causal_lm_loss(logits, labels):
    """Hugging Face's causal LM loss: predict token t+1 from position t, mean cross-entropy in fp32."""
    vocab = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), labels[:, 1:].reshape(-1))


class DecoderStack(nn.Module):
    """Embedding, decoder layers, final norm (Hugging Face's `model.model`). Each layer is called as
    layer(hidden, cos, sin) and returns (hidden, aux_loss or None); with gradient checkpointing on,
    each layer is one checkpointed region (non-reentrant unless the kwargs say otherwise)."""

    def __init__(self, vocab, hidden, layers, head_dim, eps=1e-6):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps)
        self.rotary = RotaryEmbedding(head_dim)
        self.gradient_checkpointing = False
        self.checkpoint_kwargs = {"use_reentrant": False}

    def forward(self, input_ids, use_cache=False):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(input_ids.size(1), x.dtype)
        aux_total = None
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x, aux = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, **self.checkpoint_kwargs)
            else:
                x, aux = layer(x, cos, sin)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        return ModelOutput(last_hidden_state=self.norm(x), aux_loss=aux_total)


class DecoderLM(nn.Module):
    """A decoder stack and an untied head, with Hugging Face's causal LM interface. Subclasses name
    the family (module class names are what --offload-modules and actpage's policies match)."""

    def __init__(self, stack, vocab, hidden):
        super().__init__()
        self.model = stack
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, labels=None, use_cache=False, attention_mask=None):
        out = self.model(input_ids)
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels)
            if out.aux_loss is not None:
                loss = loss + out.aux_loss
        return ModelOutput(loss=loss, logits=logits)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True
        self.model.checkpoint_kwargs = dict(gradient_checkpointing_kwargs or {"use_reentrant": False})

    def gradient_checkpointing_disable(self):
        self.model.gradient_checkpointing = False


def init_weights(model, std=0.02):
    """Normal(0, std) linear and embedding weights, zero biases, unit norms: the usual random init."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    return model
