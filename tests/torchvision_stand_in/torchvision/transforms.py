import enum

import numpy as np
import torch


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x


class ToTensor:
    """HxW or HxWxC uint8 (numpy array or PIL image) -> CxHxW float32 in [0, 1]."""

    def __call__(self, x):
        a = np.asarray(x)
        if a.ndim == 2:
            a = a[:, :, None]
        t = torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous()
        return t.float().div(255) if t.dtype == torch.uint8 else t.float()


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, x):
        m = torch.as_tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
        s = torch.as_tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
        return (x - m) / s


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


class Resize:
    """Bilinear resize of a CxHxW tensor (or a PIL image) to ``size`` (int: both sides)."""

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, antialias=None):
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, x):
        if isinstance(x, torch.Tensor):
            return torch.nn.functional.interpolate(x[None].float(), size=self.size, mode="bilinear",
                                                   align_corners=False)[0].to(x.dtype)
        from PIL import Image
        return x.resize((self.size[1], self.size[0]), Image.BILINEAR)


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        return self.fn(x)


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, x):
        return x.to(self.dtype)


class ToPILImage:
    def __call__(self, x):
        from PIL import Image
        a = x.detach().cpu()
        if a.dtype != torch.uint8:
            a = (a.float().clamp(0, 1) * 255).round().to(torch.uint8)
        a = a.numpy()
        if a.ndim == 3 and a.shape[0] == 1:
            a = a[0]
        elif a.ndim == 3:
            a = a.transpose(1, 2, 0)
        return Image.fromarray(a)


class Grayscale:
    def __init__(self, num_output_channels=1):
        self.n = num_output_channels

    def __call__(self, img):
        return img.convert("L")
