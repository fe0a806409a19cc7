"""Pure-torch stand-ins for the Hugging Face models of the zoo, for `--tiny` runs (the CPU tests: no
transformers there). Same interface as the real ones: `forward(input_ids, labels, use_cache=False)`
returning an output with `.loss` (and `["loss"]`), `gradient_checkpointing_enable(
gradient_checkpointing_kwargs=...)`, `model.layers`, `model.norm`, `lm_head`, and module class names
that the jobs' default --offload-modules match (LlamaMLP, LlamaModel, SparseMoeBlock).
"""

from zoo_layers import Attention, DecoderLM, DecoderStack, RMSNorm, SwiGLU, init_weights
from moe_model import MoEBlock, MoEDecoderLayer, SoftmaxTopKRouter

from torch import nn


class TinyLlamaMLP(SwiGLU):
    pass


class TinyLlamaDecoderLayer(nn.Module):
    def __init__(self, hidden, ffn, heads, kv_heads):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = TinyLlamaMLP(hidden, ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x)), None


class TinyLlamaModel(DecoderStack):
    pass


class TinyLlamaForCausalLM(DecoderLM):
    pass


def tiny_llama(vocab, hidden, ffn, layers, heads, kv_heads=None):
    layers = [TinyLlamaDecoderLayer(hidden, ffn, heads, kv_heads or heads) for _ in range(layers)]
    stack = TinyLlamaModel(vocab, hidden, layers, head_dim=hidden // heads)
    return init_weights(TinyLlamaForCausalLM(stack, vocab, hidden)).train()


class TinyQwen3MoeSparseMoeBlock(MoEBlock):
    pass


class TinyQwen3MoeDecoderLayer(MoEDecoderLayer):
    pass


class TinyQwen3MoeModel(DecoderStack):
    pass


class TinyQwen3MoeForCausalLM(DecoderLM):
    pass


def tiny_qwen3_moe(vocab, hidden, layers, heads, kv_heads, experts, top_k, moe_ffn):
    def block():
        return TinyQwen3MoeSparseMoeBlock(hidden, SoftmaxTopKRouter(hidden, experts, top_k), experts, moe_ffn)

    layers = [TinyQwen3MoeDecoderLayer(hidden, heads, kv_heads, block()) for _ in range(layers)]
    stack = TinyQwen3MoeModel(vocab, hidden, layers, head_dim=hidden // heads)
    return init_weights(TinyQwen3MoeForCausalLM(stack, vocab, hidden)).train()
