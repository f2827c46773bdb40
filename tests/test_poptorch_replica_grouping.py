"""PopTorch's replica-grouped weights (``model.W.replicaGrouping(...)``) and
``Options.inputReplicaGrouping``, as the PopTorch user guide describes them ("Grouping tensor
weights across replicas"), checked against the same problem trained on the CPU."""

import numpy as np
import pytest
import torch

import poptorch


class ModelWithLoss(torch.nn.Module):
    def __init__(self, w_init):
        super().__init__()
        self.W = torch.nn.Parameter(w_init)

    def forward(self, x):
        z = x @ self.W
        return z, poptorch.identity_loss(z ** 2, reduction="mean")


def test_user_guide_example_matches_cpu(execution_mode):
    """The user guide's example at 4 replicas: W split between 2 orthogonal groups of 2, the
    input between 2 consecutive groups of 2; each step equals SGD on the mean of the replicas'
    losses computed on the CPU."""
    tensor_shards, data_shards, steps = 2, 2, 3
    rng = np.random.RandomState(100)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    w_init = (rng.normal(size=(6, 8)) * 0.3).astype(np.float32)
    w = torch.tensor(w_init.reshape(6, tensor_shards, 8 // tensor_shards).transpose(1, 0, 2)).contiguous()
    model = ModelWithLoss(w.clone())
    opts = poptorch.Options()
    opts.replicationFactor(data_shards * tensor_shards)
    opts.inputReplicaGrouping(tensor_shards, poptorch.enums.CommGroupType.Consecutive)
    opts.outputMode(poptorch.OutputMode.All)
    pt = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), options=opts)
    pt.W.replicaGrouping(poptorch.enums.CommGroupType.Orthogonal, data_shards,
                         poptorch.enums.VariableRetrievalMode.OnePerGroup)
    xs = torch.tensor(x).reshape(data_shards, 8 // data_shards, 6)
    losses = [pt(xs)[1].detach().clone() for _ in range(steps)]
    assert model.W.shape == (tensor_shards, 6, 8 // tensor_shards)

    ref_w = torch.nn.Parameter(w.clone())
    opt = torch.optim.SGD([ref_w], lr=0.05)
    replicas = data_shards * tensor_shards
    for i in range(steps):
        opt.zero_grad()
        per = [((xs[r // tensor_shards] @ ref_w[r % tensor_shards]) ** 2).mean() for r in range(replicas)]
        np.testing.assert_allclose(losses[i].numpy(), torch.stack(per).detach().numpy(), rtol=1e-5)
        (sum(per) / replicas).backward()
        opt.step()
    np.testing.assert_allclose(model.W.detach().numpy(), ref_w.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_all_replicas_read_back_and_inference_per_replica(execution_mode):
    """NoGrouping: each replica its own weight; AllReplicas returns one value per replica."""
    model = ModelWithLoss(torch.arange(4 * 3 * 2, dtype=torch.float32).reshape(4, 3, 2))
    opts = poptorch.Options().replicationFactor(4)
    opts.outputMode(poptorch.OutputMode.All)
    pt = poptorch.inferenceModel(model, opts)
    pt.W.replicaGrouping(poptorch.enums.CommGroupType.NoGrouping, 0,
                         poptorch.enums.VariableRetrievalMode.AllReplicas)
    x = torch.ones(4, 1, 3)
    z, _ = pt(x)
    want = torch.cat([x[r] @ model.W[r] for r in range(4)]).detach().numpy()
    np.testing.assert_allclose(z.numpy().reshape(4, 2), want)
    pt.copyWeightsToHost()
    assert model.W.shape == (4, 3, 2)


def test_errors():
    opts = poptorch.Options().replicationFactor(4)
    with pytest.raises(ValueError, match="input_group_type cannot be All"):
        opts.inputReplicaGrouping(2, poptorch.CommGroupType.All)
    with pytest.raises(ValueError, match="input_group_size cannot be larger than replication_factor"):
        opts.inputReplicaGrouping(8, poptorch.CommGroupType.Consecutive)
    with pytest.raises(ValueError, match="input_group_size must be a factor of replication_factor"):
        opts.inputReplicaGrouping(3, poptorch.CommGroupType.Orthogonal)

    class Scalar(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.s = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return x * self.s
    pt = poptorch.inferenceModel(Scalar(), poptorch.Options().replicationFactor(2))
    pt.s.replicaGrouping(poptorch.CommGroupType.NoGrouping, 0, poptorch.VariableRetrievalMode.OnePerGroup)
    with pytest.raises(poptorch.Error, match="Scalars cannot be passed as per-replica weight tensor values"):
        pt(torch.ones(2, 3))
