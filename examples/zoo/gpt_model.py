"""A nanoGPT-style GPT written in pure torch, for gpt_accum.py and compiled.py: token and learned
position embeddings, pre-LayerNorm blocks of causal self-attention (F.scaled_dot_product_attention
where torch has it) and a GELU MLP, a final LayerNorm and a head tied to the token embedding (untie
with --untied-head). Checkpointing is per block (torch.utils.checkpoint, non-reentrant).

Module class names (what --offload-modules and actpage's policies match): GPT, Block,
CausalSelfAttention, MLP.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F
import torch.utils.checkpoint

from zoo_layers import causal_attention

GPT_TINY = dict(n_layer=2, n_embd=32, n_head=4, vocab=64, seq=16, batch=2)


def add_gpt_arguments(parser, layers, n_embd, n_head, vocab=50304):
    group = parser.add_argument_group("model (nanoGPT-style GPT)")
    group.add_argument("--n-layer", type=int, default=layers, help="n_layer (default %(default)s)")
    group.add_argument("--n-embd", type=int, default=n_embd, help="n_embd (default %(default)s)")
    group.add_argument("--n-head", type=int, default=n_head, help="n_head (default %(default)s)")
    group.add_argument("--vocab", type=int, default=vocab,
                       help="vocab_size (default %(default)s: GPT-2's 50257 padded to a multiple of 64)")
    group.add_argument("--untied-head", action="store_true", help="an lm_head of its own (default: tied to wte)")
    return group


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_embd, n_head, tied=True):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight  # nanoGPT's weight tying
        self.checkpoint_blocks = False
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.checkpoint_blocks = True

    def forward(self, idx, targets=None):
        """(logits, loss): targets are the next tokens of idx (the caller shifted them, as nanoGPT)."""
        seq = idx.size(1)
        if seq > self.block_size:
            raise ValueError("sequence of %d tokens, block size %d" % (seq, self.block_size))
        positions = torch.arange(seq, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            if self.checkpoint_blocks and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def build_gpt(args, device):
    """The GPT of args (fp32 master weights) on device, seeded by args.seed; and its description."""
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.seq, args.n_layer, args.n_embd, args.n_head, tied=not args.untied_head)
    model = model.to(device).train()
    parameters = sum(p.numel() for p in model.parameters())
    return model, {"model": "GPT (nanoGPT-style, pure torch)", "n_layer": args.n_layer, "n_embd": args.n_embd,
                   "n_head": args.n_head, "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
                   "tied_head": not args.untied_head, "parameters": parameters,
                   "weights": "fp32", "autocast": None if args.dtype == "fp32" else args.dtype}
