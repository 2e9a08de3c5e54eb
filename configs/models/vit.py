"""A Vision Transformer classifier (ViT-Base/16 at 224x224 by default).

The image is cut into ``patch`` x ``patch`` patches by a ``Conv2d`` with kernel = stride =
``patch`` (one linear projection per patch), a learned class token is prepended and learned
position embeddings added, then ``layers`` pre-LayerNorm encoder blocks (bidirectional
attention, 4x GELU MLP), a final LayerNorm and a linear head on the class token, with a
cross-entropy loss.

Sequence length is ``(image // patch) ** 2 + 1``: 197 with the defaults, as in the published
ViT-Base/16 (86M parameters, 1000 classes). HAP's ViT experiments use shorter sequences;
``image=176, patch=16`` gives 122 tokens and ``image=128, patch=8`` gives 257 if a
comparison needs them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Tiny sizes for tests and the CPU demo: 5x5 patches + class token = 26 tokens.
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "image": 20, "patch": 4, "classes": 7, "batch": 5,
         "dropout": 0.0}


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        head_dim = H // self.heads
        q = self.q(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        k = self.k(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        v = self.v(x).view(B, S, self.heads, head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, S, H)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=1e-6)
        self.attn = Attention(hidden, heads, dropout)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-6)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.dropout(self.down(F.gelu(self.up(self.ln2(x)))))


class ViT(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, image: int, patch: int, classes: int,
                 dropout: float):
        super().__init__()
        if image % patch:
            raise ValueError(f"image={image} is not a multiple of patch={patch}")
        tokens = (image // patch) ** 2 + 1
        self.patchify = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos = nn.Parameter(torch.empty(1, tokens, hidden))
        nn.init.normal_(self.pos, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2)        # [B, patches, hidden]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.drop(x + self.pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x)[:, 0])
        return F.cross_entropy(logits, labels)


def model(layers: int = 12, hidden: int = 768, heads: int = 12, image: int = 224, patch: int = 16,
          classes: int = 1000, batch: int = 8, dropout: float = 0.1) -> nn.Module:
    return ViT(layers, hidden, heads, image, patch, classes, dropout)


def inputs(layers: int = 12, hidden: int = 768, heads: int = 12, image: int = 224, patch: int = 16,
           classes: int = 1000, batch: int = 8, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels from a fixed generator (every rank builds the same batch)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    return images, labels
