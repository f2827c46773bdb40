import torch


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, x):
        return torch.from_numpy(x).permute(2, 0, 1).float() / 255


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, x):
        return (x - self.mean) / self.std
