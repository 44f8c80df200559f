"""Primary capsules: a convolution whose channels are grouped into squashed capsule vectors.

Sabour, Frosst & Hinton (2017), Sec. 4 (PrimaryCapsules: 32 channels of 8-D capsules, 9x9, stride 2).
"""

from __future__ import annotations

from torch import Tensor, nn

from capsnets.functional import squash
from capsnets.validation import ArgumentError, conv_output_size, non_negative_int, positive_int


class PrimaryCapsules(nn.Module):
    """Convolution -> capsules -> squash.

    Args:
        in_channels: channels of the input feature map.
        num_types: capsule types (the paper's 32 "channels" of capsules).
        capsule_dim: dimension of each capsule vector (8 in the paper).
        kernel_size: convolution kernel size.
        stride: convolution stride.
        padding: convolution zero padding.

    Shape:
        - input: ``(B, in_channels, H, W)``
        - output: ``(B, num_types * H' * W', capsule_dim)``, capsules ordered by (type, row, column).

    Examples:
        >>> layer = PrimaryCapsules(256, 32, 8, kernel_size=9, stride=2)
        >>> layer(torch.randn(2, 256, 20, 20)).shape
        torch.Size([2, 1152, 8])
    """

    def __init__(
        self,
        in_channels: int,
        num_types: int,
        capsule_dim: int,
        *,
        kernel_size: int = 9,
        stride: int = 2,
        padding: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_channels = positive_int("in_channels", in_channels)
        self.num_types = positive_int("num_types", num_types)
        self.capsule_dim = positive_int("capsule_dim", capsule_dim)
        self.kernel_size = positive_int("kernel_size", kernel_size)
        self.stride = positive_int("stride", stride)
        self.padding = non_negative_int("padding", padding)
        self.conv = nn.Conv2d(
            in_channels, num_types * capsule_dim, kernel_size, stride, padding, device=device, dtype=dtype
        )

    def output_grid(self, height: int, width: int) -> tuple[int, int]:
        """Spatial size ``(H', W')`` of the capsule grid for an ``H x W`` input."""
        out = tuple(conv_output_size(s, self.kernel_size, self.stride, self.padding) for s in (height, width))
        if min(out) < 1:
            raise ArgumentError(
                f"input of {height}x{width} is smaller than the primary capsule kernel ({self.kernel_size}, "
                f"padding {self.padding})"
            )
        return out

    def num_capsules(self, height: int, width: int) -> int:
        """Number of capsules produced for an ``H x W`` input."""
        grid_h, grid_w = self.output_grid(height, width)
        return self.num_types * grid_h * grid_w

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ArgumentError(f"PrimaryCapsules expects (B, {self.in_channels}, H, W), got {tuple(x.shape)}")
        maps = self.conv(x)  # (B, T*D, H', W')
        batch, _, height, width = maps.shape
        caps = maps.view(batch, self.num_types, self.capsule_dim, height, width)
        caps = caps.permute(0, 1, 3, 4, 2).reshape(batch, -1, self.capsule_dim)  # (B, T*H'*W', D)
        return squash(caps)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, num_types={self.num_types}, capsule_dim={self.capsule_dim}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
        )
