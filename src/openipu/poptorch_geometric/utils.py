"""``TrainingStepper`` and ``set_aggregation_dim_size`` (PopTorch Geometric's
``poptorch_geometric.utils``): compare a model trained on the CPU with the same model trained
through ``poptorch.trainingModel``."""

from __future__ import annotations

import copy

import torch

from openipu import poptorch


def set_aggregation_dim_size(model: torch.nn.Module, dim_size: int) -> None:
    """Make every PyG ``MessagePassing`` layer of ``model`` aggregate into ``dim_size`` rows
    (at least the number of nodes of the fixed-size batch), through an aggregate pre-hook, so
    the aggregation has a static output shape. Mirrors
    ``poptorch_geometric.utils.set_aggregation_dim_size``."""
    from torch_geometric.nn import MessagePassing

    def hook(module, inputs):
        kwargs = inputs[-1]
        kwargs["dim_size"] = dim_size
        return kwargs
    for m in model.modules():
        if isinstance(m, MessagePassing):
            m.register_aggregate_forward_pre_hook(hook)


class TrainingStepper:
    """``TrainingStepper(model, lr=0.001, optimizer=poptorch.optim.Adam, options=None,
    rtol=None, atol=None, enable_fp_exception=True, equal_nan=False)``: trains ``model`` (whose ``forward``
    returns ``(result, loss)``) on the CPU with ``torch.optim``'s version of ``optimizer`` and
    a deep copy of it through ``poptorch.trainingModel``, one step each per call;
    ``run(num_steps, batch)`` checks the losses and the trained parameters match;
    ``check_model(batch)`` compares forward outputs of both (NaNs compare equal when
    ``equal_nan``). Raises ``AssertionError`` on a mismatch."""

    def __init__(self, model, lr: float = 0.001, optimizer=poptorch.optim.Adam, options=None, rtol=None, atol=None,
                 enable_fp_exception: bool = True, equal_nan: bool = False):
        self.lr = lr
        self.equal_nan = bool(equal_nan)
        self.rtol = rtol
        self.atol = atol
        self.options = options or poptorch.Options()
        self.model = model
        self.ipu_model = copy.deepcopy(model)
        torch_opt = getattr(torch.optim, optimizer.__name__)
        self.optimizer = torch_opt(self.model.parameters(), lr=lr)
        self.ipu_optimizer = optimizer(self.ipu_model.parameters(), lr=lr)
        self.model.train()
        self.training_model = poptorch.trainingModel(self.ipu_model, self.options, self.ipu_optimizer)

    def cpu_step(self, batch):
        self.optimizer.zero_grad()
        result, loss = self.model(*batch) if isinstance(batch, (tuple, list)) else self.model(batch)
        loss.backward()
        self.optimizer.step()
        return result, loss

    def ipu_step(self, batch):
        return self.training_model(*batch) if isinstance(batch, (tuple, list)) else self.training_model(batch)

    def _close(self, a, b):
        kw = {"equal_nan": self.equal_nan}
        if self.rtol is not None:
            kw["rtol"] = self.rtol
        if self.atol is not None:
            kw["atol"] = self.atol
        torch.testing.assert_close(a, b, **kw)

    def check_model(self, batch):
        """Forward ``batch`` through both models in eval mode and compare the results."""
        self.model.eval()
        self.ipu_model.eval()
        with torch.no_grad():
            cpu = self.model(*batch) if isinstance(batch, (tuple, list)) else self.model(batch)
            inf = poptorch.inferenceModel(self.ipu_model, self.options)
            ipu = inf(*batch) if isinstance(batch, (tuple, list)) else inf(batch)
        self.model.train()
        self.ipu_model.train()
        self._close(ipu, cpu)

    def run(self, num_steps: int, batch):
        """``num_steps`` steps on both; returns (cpu losses, ipu losses) after checking that
        the losses and the trained parameters match."""
        cpu_loss, ipu_loss = [], []
        for _ in range(num_steps):
            _, c = self.cpu_step(batch)
            _, i = self.ipu_step(batch)
            cpu_loss.append(c.detach())
            ipu_loss.append(torch.as_tensor(i).detach())
        cpu_loss, ipu_loss = torch.stack(cpu_loss), torch.stack(ipu_loss).reshape(-1)
        self._close(ipu_loss, cpu_loss)
        for (name, p), q in zip(self.model.named_parameters(), self.ipu_model.parameters()):
            self._close(q.detach(), p.detach())
        return cpu_loss, ipu_loss
