"""PopTorch programs as their users write them (issue 36, the "wild" corpus): each test is one
behaviour such a program relied on that failed before, checked against PopTorch's documented
behaviour or against PyTorch on the CPU."""

from __future__ import annotations

import torch

import poptorch


class PlainCounter(torch.nn.Module):
    """A counter kept in a plain tensor attribute (not a registered buffer)."""

    def __init__(self):
        super().__init__()
        self.i = torch.tensor([0.0])

    def forward(self):
        self.i += 1
        return self.i


def test_plain_tensor_attribute_changed_once_by_the_trace():
    # PopTorch's docs/user_guide/buffers.py: the attribute is a constant of the graph (each run
    # returns 1) and the host tensor is changed once, by the trace
    m = PlainCounter()
    host = m.i
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    torch.testing.assert_close(pm(), torch.tensor([1.0]))
    assert m.i is host
    torch.testing.assert_close(m.i, torch.tensor([1.0]))


def test_unmutated_plain_attribute_left_alone():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = torch.tensor([2.0])

        def forward(self, x):
            return x * self.k

    m = Scale()
    pm = poptorch.inferenceModel(m)
    torch.testing.assert_close(pm(torch.ones(2)), torch.full((2,), 2.0))
    torch.testing.assert_close(m.k, torch.tensor([2.0]))
