"""A small image classifier for the DALI image path (decoded, normalised float images)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCNN(nn.Module):
    """Three conv-BN-ReLU stages (stride 2 after the first) → global average pool → linear.

    ``forward(images, labels)``: ``images`` float [B, 3, H, W] (any H, W ≥ 8), ``labels`` int64 [B];
    returns the fp32 SUM of cross entropy over the batch (nats), like the text model, so the trainer
    normalises by the global sample count. :meth:`logits` returns [B, num_classes].
    """

    def __init__(self, num_classes: int, width: int = 32):
        super().__init__()
        chans = [3, width, 2 * width, 4 * width]
        layers = []
        for i in range(3):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                       nn.BatchNorm2d(chans[i + 1]), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(chans[-1], num_classes)

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """float ``[B, 3, H, W]`` images → ``[B, num_classes]`` logits."""
        return self.head(self.features(images).mean(dim=(2, 3)))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed cross entropy (fp32 scalar, nats) of ``images`` against int64 ``labels`` ``[B]``."""
        return F.cross_entropy(self.logits(images).float(), labels, reduction="sum")
