"""Three SGD steps of a small model with 4 data-parallel replicas, for ``test_popdist.py``.

``python popdist_train.py MODE MODEL OUT``:

- ``MODE=poptorch``: PopTorch training; under ``poprun`` (PopDist's environment set) with
  ``popdist.poptorch.Options`` (this instance's replicas and rows of each global batch), else one
  process with ``replicationFactor(4)``;
- ``MODE=ddp``: PyTorch ``DistributedDataParallel`` on the CPU (gloo), one process per replica,
  started by this script with ``torch.multiprocessing``;
- ``MODEL``: ``bert`` (``transformers``' ``BertForSequenceClassification`` in BERT-tiny's shape)
  or ``mlp``; random init with the seed of the instance / DDP rank, so the runs agree only if
  instance / rank 0's initial weights reach the others (PopDist's and DDP's broadcast at the
  start).

Writes the weights after the 3 steps (``torch.save`` of the state dict; instance ``i`` of a
``poprun`` run writes ``OUT.i``), the step losses, the last step's predicted IPU cycles and the
host seconds of each step (:func:`train_poptorch`, which ``benchmarks/scaleout.py`` runs too).
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

REPLICAS, MICRO, STEPS, SEQ, LR = 4, 2, 3, 16, 0.05


class Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification
        # BERT-tiny's shape (google/bert_uncased_L-2_H-128_A-2: 2 layers, hidden 128, 2 heads,
        # intermediate 512) with a vocabulary of 256 and 64 positions
        cfg = BertConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=512, max_position_embeddings=64, num_labels=3,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        self.m = BertForSequenceClassification(cfg)

    def forward(self, x, y):
        return F.cross_entropy(self.m(input_ids=x).logits, y)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.b(torch.relu(self.a(x))), y)


def model(name, seed=0):
    """The model with the initial weights of ``seed``: each instance / DDP rank its own (PopDist and
    DDP broadcast instance / rank 0's at the start)."""
    torch.manual_seed(seed)
    return (Bert if name == "bert" else Mlp)().train()


def batches(name):
    """``STEPS`` global batches of ``REPLICAS * MICRO`` samples: replica ``r`` takes rows
    ``[r * MICRO, (r + 1) * MICRO)``."""
    g = torch.Generator().manual_seed(1)
    n = REPLICAS * MICRO
    out = []
    for _ in range(STEPS):
        x = torch.randint(0, 256, (n, SEQ), generator=g) if name == "bert" else torch.randn(n, 8, generator=g)
        out.append((x, torch.randint(0, 3, (n,), generator=g)))
    return out


def train_poptorch(make_model, steps, out, replicas=REPLICAS, micro=MICRO, lr=LR):
    """PopTorch data-parallel training of ``make_model(seed)`` (a module whose ``forward(x, y)``
    returns the loss) with SGD (``lr``) over the global batches ``steps`` (``(x, y)`` of
    ``replicas * micro`` rows; replica ``r`` takes rows ``[r * micro, (r + 1) * micro)``).

    Under ``poprun`` (PopDist's environment set): ``popdist.poptorch.Options``, this instance's
    replicas and rows, the model built with the instance's index as seed (instance 0's weights
    reach the others by the broadcast at the compile), the result written to ``OUT.i``. Else one
    process with ``replicationFactor(replicas)``, seed 0, written to ``out``.

    Writes and returns (``torch.save``) a dict: ``state`` (the state dict after the steps),
    ``losses`` (per step, this process's replicas' losses), ``cycles`` (the last step's
    predicted IPU cycles, ``cycleCount()``), ``host_s`` / ``cpu_s`` (per step, the host wall
    seconds, ``time.perf_counter``, and the host CPU seconds of this process,
    ``time.process_time``; the first step compiles) and ``rss_mb`` (peak RSS of the process)."""
    import resource

    import popdist
    import poptorch

    class WithLoss(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, y):
            return poptorch.identity_loss(self.m(x, y), reduction="none")

    if popdist.isPopdistEnvSet():
        import popdist.poptorch
        opts = popdist.poptorch.Options()
        lo, n = popdist.getReplicaIndexOffset(), popdist.getNumLocalReplicas()
        out = f"{out}.{popdist.getInstanceIndex()}"
    else:
        opts = poptorch.Options().replicationFactor(replicas)
        lo, n = 0, replicas
    opts.logCycleCount(True)
    m = make_model(popdist.getInstanceIndex())
    tm = poptorch.trainingModel(WithLoss(m), opts, optimizer=poptorch.optim.SGD(m.parameters(), lr=lr))
    res = {"losses": [], "host_s": [], "cpu_s": []}
    for x, y in steps:
        t0, c0 = time.perf_counter(), time.process_time()
        loss = tm(x[lo * micro:(lo + n) * micro], y[lo * micro:(lo + n) * micro])
        res["host_s"].append(time.perf_counter() - t0)
        res["cpu_s"].append(time.process_time() - c0)
        res["losses"].append(loss.reshape(-1).tolist())
    tm.copyWeightsToHost()
    res.update(state=m.state_dict(), cycles=tm.cycleCount(),
               rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    torch.save(res, out)
    return res


def run_poptorch(name, out):
    train_poptorch(lambda seed: model(name, seed), batches(name), out)


def _ddp_worker(rank, name, out, port):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=REPLICAS)
    torch.set_num_threads(1)
    m = model(name, rank)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for x, y in batches(name):
        opt.zero_grad()
        ddp(x[rank * MICRO:(rank + 1) * MICRO], y[rank * MICRO:(rank + 1) * MICRO]).backward()
        opt.step()
    if rank == 0:
        torch.save({"state": m.state_dict()}, out)
    dist.destroy_process_group()


def run_ddp(name, out):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_worker, args=(name, out, port), nprocs=REPLICAS)


if __name__ == "__main__":
    mode, name, path = sys.argv[1:4]
    (run_poptorch if mode == "poptorch" else run_ddp)(name, path)
