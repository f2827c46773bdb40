"""PopDist / poprun (issue 41): the PopDist API, poprun's instances and their failure handling,
cross-instance collectives over torch.distributed, and data-parallel training under
``poprun --num-instances 2`` against one process and PyTorch DDP."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import popdist
from openipu.popdist import poprun

HERE = Path(__file__).parent
SRC = str(HERE.parent / "src")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPDIST_") and not k.startswith("OMPI_")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(kw)
    return env


def _poprun(args, tmp_path, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "openipu.popdist.poprun", *args], cwd=tmp_path, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def test_getters_outside_and_inside_poprun(monkeypatch):
    for k in poprun.instance_env(0, 1, 1, 1, "x", 1):
        monkeypatch.delenv(k, raising=False)
    assert not popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex(), popdist.getNumTotalReplicas(),
            popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset()) == (1, 0, 1, 1, 0)
    for k, v in poprun.instance_env(1, 2, 8, 2, "127.0.0.1", 1234).items():
        monkeypatch.setenv(k, v)
    assert popdist.isPopdistEnvSet()
    assert (popdist.getNumInstances(), popdist.getInstanceIndex(), popdist.getNumTotalReplicas(),
            popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset(), popdist.getNumIpusPerReplica(),
            popdist.getDeviceId()) == (2, 1, 8, 4, 4, 2, 0)
    assert popdist.execute_on_instances({1}, lambda a: a + 1, 1) == 2
    assert popdist.execute_on_instances({0}, lambda a: a + 1, 1) is None
    # (no rendezvous in this test: init() would join the instances' group)
    monkeypatch.setattr("openipu.poplibs.gcl_instances.init_process_group", lambda: None)
    # popdist.popart: the session options of instance 1 of 2
    import popart
    from popdist import popart as pd_popart
    o = popart.SessionOptions()
    pd_popart.configureSessionOptions(o)
    assert (o.enableReplicatedGraphs, o.replicatedGraphCount, o.enableDistributedReplicatedGraphs,
            o.globalReplicationFactor, o.globalReplicaOffset) == (True, 4, True, 8, 4)
    assert o.getGlobalReplicationFactor() == 8
    # popdist.poptorch.Options: local replicas, process id; DataLoader shares follow
    from popdist import poptorch as pd_poptorch
    po = pd_poptorch.Options()
    assert (po.replication_factor, po.Distributed.processId, po.Distributed.numProcesses) == (4, 1, 2)
    so = po.session_options(True, 1, False)
    assert (so.globalReplicationFactor, so.globalReplicaOffset) == (8, 4)
    with pytest.raises(RuntimeError, match="--ipus-per-replica 2"):
        pd_poptorch.Options(ipus_per_replica=1)


def test_inconsistent_environment_raises(monkeypatch):
    for k, v in poprun.instance_env(0, 2, 4, 1, "127.0.0.1", 1).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "3")
    with pytest.raises(RuntimeError, match="inconsistent environment"):
        popdist.init()


def test_distributed_session_options_checked():
    import popart
    from openipu.popart.session import _validate_distributed
    o = popart.SessionOptions()
    o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
    o.enableDistributedReplicatedGraphs, o.globalReplicationFactor, o.globalReplicaOffset = True, 4, 1
    with pytest.raises(popart.popart_exception, match="globalReplicaOffset"):
        _validate_distributed(o)
    o.globalReplicaOffset = 2
    _validate_distributed(o)


def test_poprun_argument_errors(capsys):
    assert poprun.main(["--num-instances", "2", "--num-replicas", "3", "true"]) == 2
    assert "multiple of --num-instances" in capsys.readouterr().err


def test_poprun_env_tagging_and_ignored_options(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os\nprint(os.environ['POPDIST_INSTANCE_INDEX'], os.environ['POPDIST_NUM_LOCAL_REPLICAS'],"
                      " os.environ['POPDIST_REPLICA_INDEX_OFFSET'], os.environ['OMPI_COMM_WORLD_RANK'],"
                      " os.environ.get('MY_VAR'))\n")
    r = _poprun(["--num-instances", "2", "--num-replicas", "4", "--vipu-partition", "p0",
                 "--mpi-global-args", "--tag-output -x MY_VAR=7 --bind-to none", sys.executable, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[1,0]<stdout>:0 2 0 0 7", "[1,1]<stdout>:1 2 2 1 7"]
    assert "--vipu-partition ignored" in r.stderr and "'--bind-to' has no effect" in r.stderr


def test_poprun_stops_the_others_when_an_instance_fails(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['POPDIST_INSTANCE_INDEX'] == '1':\n    sys.exit(3)\n"
                      "time.sleep(600)\n")
    r = _poprun(["--num-instances", "3", "--kill-grace", "1", sys.executable, str(script)], tmp_path, timeout=120)
    assert r.returncode == 3
    assert "instance 1 exited with code 3; stopping instances 0, 2" in r.stderr


_COLLECTIVE = textwrap.dedent("""
    import os, sys, time
    import torch
    from openipu.poplibs import gcl_instances
    i = int(os.environ["POPDIST_INSTANCE_INDEX"])
    local = torch.tensor([[1.0 + 2 * i, 10.0], [2.0 + 2 * i, 20.0]])          # 2 local replicas
    out = gcl_instances.all_reduce_replicas(local, "ADD")
    print("sum", i, out.tolist(), flush=True)
    print("max", i, gcl_instances.all_reduce_replicas(local, "MAX").tolist(), flush=True)
    if sys.argv[1] == "hang" and i == 1:
        time.sleep(600)                                                      # instance 1 hangs
    gcl_instances.all_reduce_replicas(local, "ADD", what="step 2 gradients")
    print("done", i, flush=True)
""")


@pytest.mark.slow     # two poprun runs of two processes each (~50 s on the loaded 2-core host)
def test_cross_instance_all_reduce_and_hung_instance(tmp_path):
    script = tmp_path / "coll.py"
    script.write_text(_COLLECTIVE)
    r = _poprun(["--num-instances", "2", "--num-replicas", "4", "--kill-grace", "1", "--collective-timeout", "4",
                 "--mpi-global-args=--tag-output", sys.executable, str(script), "ok"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [x.split(":", 1)[1] for x in r.stdout.splitlines()]
    assert "sum 0 [[10.0, 60.0], [10.0, 60.0]]" in lines and "sum 1 [[10.0, 60.0], [10.0, 60.0]]" in lines
    assert "max 1 [[4.0, 20.0], [4.0, 20.0]]" in lines
    r = _poprun(["--num-instances", "2", "--num-replicas", "4", "--kill-grace", "1", "--collective-timeout", "4",
                 sys.executable, str(script), "hang"], tmp_path, timeout=300)
    assert r.returncode != 0
    assert "Instance 0 of 2: the cross-instance collective 'step 2 gradients' failed" in r.stderr
    assert "an instance has stopped or hangs" in r.stderr
    assert "instance 0 exited with code 1; stopping instances 1" in r.stderr
    assert "done" not in r.stdout


_CHAIN = textwrap.dedent("""
    import sys
    import torch
    from openipu.poplibs import gcl_instances
    from openipu.poplibs.gcl import _combine, _reduce
    i, n, L = gcl_instances.instance_index(), gcl_instances.num_instances(), 2
    every = torch.randn(n * L, 7, 3, generator=torch.Generator().manual_seed(5))
    every = every * torch.logspace(-4, 4, 7)[None, :, None]          # magnitudes where the order shows
    ok = []
    for groups in ([list(range(n * L))], [[0, 2, 4], [1, 3, 5]], [[0, 1], [2, 3], [4, 5]], [[4, 0, 2], [5, 1, 3]]):
        for op in ("ADD", "MUL", "MAX", "SQUARE_ADD"):
            prep = (lambda x: x * x) if op == "SQUARE_ADD" else None
            for v in (every, every.half()):
                got = gcl_instances.reduce_groups(v[i * L:(i + 1) * L], groups, i * L,
                                                  lambda a, b: _combine(op, a, b), prep, "t")
                ok.append(torch.equal(got, _reduce(v[torch.tensor(groups)], op, 1)))
    local = every[i * L:(i + 1) * L]
    for op in ("ADD", "MEAN"):
        ok.append(torch.equal(gcl_instances.all_reduce_replicas(local, op), _reduce(every, op, 0).expand_as(local)))
    pairwise = (every[0] + every[1] + every[2]) + (every[3] + every[4] + every[5])
    # one write per line: the instances share poprun's stdout
    sys.stdout.write(f"chain {i} {all(ok)} {len(ok)} {torch.equal(pairwise, _reduce(every, 'ADD', 0))}\\n")
    sys.stdout.flush()
""")


@pytest.mark.slow     # three processes (~15 s)
def test_chain_reduce_is_bit_identical_to_one_process(tmp_path):
    """``gcl_instances.reduce_groups`` over 3 instances x 2 replicas (a chain through the
    instances, not an all-gather) equals the one-process ring-order fold bit for bit: float32 and
    float16, ADD / MUL / MAX / SQUARE_ADD, over all replicas, over orthogonal and consecutive
    groups and over a group whose ring returns to an earlier instance (the all-gather fall-back);
    the data are such that a per-instance pairwise sum would differ."""
    script = tmp_path / "chain.py"
    script.write_text(_CHAIN)
    r = _poprun(["--num-instances", "3", "--num-replicas", "6", sys.executable, str(script)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(line for line in r.stdout.split("\n") if line.startswith("chain")) == \
        [f"chain {i} True 34 False" for i in range(3)]


def _run_script(tmp_path, cmd, instances, execution):
    """``cmd`` in one process, or under ``poprun`` with ``instances`` instances and 4 replicas, on
    the ``OPENIPU_EXECUTION`` path ``execution``; asserts it exits 0 and returns the result."""
    if instances:
        r = _poprun(["--num-instances", str(instances), "--num-replicas", "4", *cmd], tmp_path, timeout=1200,
                    OPENIPU_EXECUTION=execution)
    else:
        r = subprocess.run(cmd, cwd=tmp_path, env=_env(OPENIPU_EXECUTION=execution), capture_output=True, text=True,
                           timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _train(tmp_path, mode, model, out, instances=0, execution="ir"):
    _run_script(tmp_path, [sys.executable, str(HERE / "popdist_train.py"), mode, model, str(tmp_path / out)],
                instances, execution)


@pytest.mark.slow
@pytest.mark.parametrize("model,execution", [("mlp", "ir"), ("bert", "ir"), ("mlp", "device"), ("bert", "device")])
def test_training_under_poprun_matches_one_process_and_ddp(tmp_path, model, execution):
    """4 replicas, 3 SGD steps, every instance / DDP rank initialising the model with its own seed
    (the weight broadcast from instance 0 at the compile makes them agree): ``poprun
    --num-instances 2`` (2 replicas each) gives bit-identical
    weights to one process with 4 replicas, the same per-replica losses and predicted cycles, and
    PyTorch DDP's weights (gloo, 4 CPU processes) within fp32 rounding; on the IR executor (the
    default) and on the device emulation."""
    _train(tmp_path, "poptorch", model, "one.pt", execution=execution)
    _train(tmp_path, "poptorch", model, "two.pt", instances=2, execution=execution)
    one = torch.load(tmp_path / "one.pt")
    parts = [torch.load(tmp_path / f"two.pt.{i}") for i in range(2)]
    for k, v in one["state"].items():
        for p in parts:
            assert torch.equal(p["state"][k], v), k
    assert [a + b for a, b in zip(parts[0]["losses"], parts[1]["losses"])] == one["losses"]
    assert parts[0]["cycles"] == parts[1]["cycles"] == one["cycles"] > 0
    _train(tmp_path, "ddp", model, "ddp.pt")
    ddp = torch.load(tmp_path / "ddp.pt")
    for k, v in one["state"].items():
        torch.testing.assert_close(v, ddp["state"][k], rtol=1e-5, atol=1e-6)


def _collective_cost(global_replicas, monkeypatch):
    """The Collective step an all-reduce of 1000 floats adds on a 2-replica graph that holds
    replicas [0, 2) of ``global_replicas`` (2 = not distributed)."""
    from openipu import poplar
    from openipu.poplar import program as P
    from openipu.poplibs import gcl, gcl_instances, poputil
    monkeypatch.setenv("POPDIST_NUM_INSTANCES", str(global_replicas // 2))
    m = poplar.IPUModel()
    m.numIPUs, m.tilesPerIPU = 2, 4
    g = poplar.Graph(m.createDevice().getTarget(), replication_factor=2)
    x = g.addVariable(poplar.FLOAT, [1000], "x")
    poputil.mapTensorLinearly(g, x)
    prog = P.Sequence()
    with gcl_instances.scope(global_replicas, 0, 2):
        gcl.allReduceCrossReplica(g, x, "ADD", prog, debug_name="ar")
    (step,) = [s for s in prog.programs if isinstance(s, P.Collective)]
    return step


def test_collective_cost_follows_the_global_ring(monkeypatch):
    """A distributed replicated graph costs its collectives over the global replicas' ring: 4
    replicas stay on IPU-Links, 128 (two IPU-POD64 racks) cross GW-Links and take longer."""
    from openipu.ipu import SYSTEMS
    from openipu.poplibs import gcl_instances
    local = _collective_cost(2, monkeypatch).cost.total().max()
    pod4 = _collective_cost(4, monkeypatch).cost.total().max()
    pod128 = _collective_cost(128, monkeypatch).cost.total().max()
    assert local < pod4 < pod128
    assert SYSTEMS["IPU-POD128"].gw_links and not SYSTEMS["IPU-POD64"].gw_links
    assert SYSTEMS["IPU-POD128"].machines == 32 and SYSTEMS["IPU-POD128"].ipu_link_domains == 2
    with pytest.raises(Exception, match="local replication factor"):
        with gcl_instances.scope(6, 0, 2):
            pass


def _popart(tmp_path, out, variant, execution, instances=0):
    """``tests/popdist_popart.py`` (one process, or ``poprun`` with ``instances``): its weights
    (``{id: array}``, instance ``i``'s for each instance) and the execution path that ran it."""
    import numpy as np
    r = _run_script(tmp_path, [sys.executable, str(HERE / "popdist_popart.py"), str(tmp_path / out),
                               *variant.split()], instances, execution)
    assert r.stdout.count(f"executor: {execution}") == max(instances, 1), r.stdout
    files = [tmp_path / f"{out}.{i}.npz" for i in range(instances)] if instances else [tmp_path / f"{out}.npz"]
    return [dict(np.load(f)) for f in files]


@pytest.mark.slow
@pytest.mark.parametrize("variant,execution", [("", "ir"), ("rts", "ir"), ("rts adam", "ir"), ("rts", "device")])
def test_popart_training_under_poprun_matches_one_process(tmp_path, variant, execution):
    """PopART with ``popdist.popart.configureSessionOptions`` / ``getDevice``: SGD with momentum
    (or Adam), Mean reduction, 4 replicas as 2 instances x 2, each instance drawing its own
    initial weights and ``TrainingSession.broadcastWeights()`` giving every instance instance 0's:
    bit-identical weights to one process, on the IR executor (the default) and the device
    emulation. ``rts``: the optimizer state sharded over the 4 replicas of both instances
    (replicated tensor sharding: reduce-scatter, update of the piece, all-gather across the
    instances; ``weightsToHost`` gathers the pieces; the bias's 15 elements padded to 4 pieces of
    4): the state bit-identical too, and the weights those of the unsharded one-process run."""
    import numpy as np
    (one,) = _popart(tmp_path, "one", variant, execution)
    for two in _popart(tmp_path, "two", variant, execution, instances=2):
        assert sorted(two) == sorted(one)
        for k in one:
            np.testing.assert_array_equal(two[k], one[k], err_msg=k)
    rng = np.random.default_rng(0)
    assert not np.allclose(one["w1"], rng.standard_normal((8, 15)).astype(np.float32) * 0.3)   # it trained
    state = {"": [], "rts": ["Accl1___"], "rts adam": ["Accl1___", "Accl2___"]}[variant]
    assert sorted(one) == sorted([p + w for p in ["", *state] for w in ("w1", "b1", "w2")])
    if state:
        assert all(np.abs(one[p + w]).max() > 0 for p in state for w in ("w1", "b1", "w2"))
        (plain,) = _popart(tmp_path, "plain", variant.replace("rts", ""), execution)
        for k in plain:
            np.testing.assert_array_equal(plain[k], one[k], err_msg=k)


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/ip").exists() and not Path("/sbin/ip").exists(),
                    reason="network namespaces need root and iproute2")
@pytest.mark.parametrize("model", ["mlp", "bert"])
def test_instances_in_two_network_namespaces(tmp_path, model):
    """Each instance in its own network namespace (loopback plus one veth pair between the two,
    set up here): the instances meet over TCP on the veth addresses and train the model (the MLP,
    and BERT-tiny from ``transformers``: 4 replicas, 3 SGD steps, each instance its own initial
    weights) to the one-process weights bit for bit, and to PyTorch DDP's within fp32 rounding."""
    tag = f"{os.getpid() % 100000}"
    ns, veth = [f"oipu{tag}n{i}" for i in range(2)], [f"oipu{tag}v{i}" for i in range(2)]
    addr = ["10.233.0.1", "10.233.0.2"]
    try:
        for n in ns:
            _ip("netns", "add", n)
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for i in range(2):
            _ip("link", "set", veth[i], "netns", ns[i])
            _ip("-n", ns[i], "addr", "add", f"{addr[i]}/24", "dev", veth[i])
            _ip("-n", ns[i], "link", "set", veth[i], "up")
            _ip("-n", ns[i], "link", "set", "lo", "up")
        _train(tmp_path, "poptorch", model, "one.pt")
        procs = []
        for i in range(2):
            env = _env(**poprun.instance_env(i, 2, 4, 1, addr[0], 29533, timeout=300), GLOO_SOCKET_IFNAME=veth[i])
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns[i], sys.executable, str(HERE / "popdist_train.py"),
                                           "poptorch", model, str(tmp_path / "ns.pt")], env=env, cwd=tmp_path,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for p in procs:
            out, _ = p.communicate(timeout=1200)
            assert p.returncode == 0, out[-3000:]
        one = torch.load(tmp_path / "one.pt")
        parts = [torch.load(tmp_path / f"ns.pt.{i}") for i in range(2)]
        for got in parts:
            for k, v in one["state"].items():
                assert torch.equal(got["state"][k], v), k
        assert [a + b for a, b in zip(parts[0]["losses"], parts[1]["losses"])] == one["losses"]
        _train(tmp_path, "ddp", model, "ddp.pt")
        ddp = torch.load(tmp_path / "ddp.pt")
        for k, v in one["state"].items():
            torch.testing.assert_close(v, ddp["state"][k], rtol=1e-5, atol=1e-6)
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


def test_distributed_options_without_instances_raise(monkeypatch):
    """PopTorch told it is process 0 of 2 but started alone: the compile says to use poprun."""
    import poptorch
    for k in poprun.instance_env(0, 1, 1, 1, "x", 1):
        monkeypatch.delenv(k, raising=False)
    m = torch.nn.Linear(2, 2)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return poptorch.identity_loss(self.m(x).sum(), reduction="none")
    o = poptorch.Options().replicationFactor(2)
    o.Distributed.configureProcessId(0, 2)
    tm = poptorch.trainingModel(L(), o, optimizer=poptorch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(Exception, match="start the program with poprun --num-instances 2 --num-replicas 4"):
        tm(torch.ones(2, 2))



def test_broadcast_weights_alone_and_bad_root(monkeypatch):
    """``TrainingSession.broadcastWeights()`` in a single instance leaves the weights as they are;
    a root that is not an instance raises ``popart_exception``."""
    import numpy as np
    import popart
    for k in poprun.instance_env(0, 1, 1, 1, "x", 1):
        monkeypatch.delenv(k, raising=False)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w0 = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = b.addInitializedInputTensor(w0, "w")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([x, w])], 0.1)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.1), popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    s.broadcastWeights()
    s.weightsFromHost()
    out = {"w": np.zeros((3, 2), np.float32)}
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(out["w"], w0)
    with pytest.raises(popart.popart_exception, match="root instance 1 is not one of the 1 instances"):
        s.broadcastWeights(1)


def _graphcore_example(path: str) -> str | None:
    """A file of graphcore/examples: from ``$GRAPHCORE_EXAMPLES`` (a checkout) or this host's
    mirror (a bare repository); None when neither exists."""
    root = os.environ.get("GRAPHCORE_EXAMPLES")
    if root and (Path(root) / path).exists():
        return (Path(root) / path).read_text()
    mirror = Path("/work/.mirror/graphcore+examples/repo")
    if mirror.exists():
        r = subprocess.run(["git", "-C", str(mirror), "show", f"HEAD:{path}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
    return None


@pytest.mark.slow     # two instances train and validate a ResNet-18 (~5 min on the loaded 2-core host)
def test_graphcore_popdist_poptorch_example(tmp_path):
    """Graphcore's ``tutorials/feature_examples/pytorch/popdist/popdist_training.py``, unmodified,
    under ``poprun --num-instances 2 --num-replicas 2`` (1 epoch, batch 4, no loader workers), with
    ``tests/torchvision_stand_in`` for torchvision (ResNet-18, synthetic CIFAR-10: the real
    torchvision does not load here). The instances initialise ResNet-18 from different host RNG
    states; as in Graphcore's own test of the example, every weight and bias of the two
    instances' checkpoints must agree (the BatchNorm running statistics are each replica's own)."""
    src = _graphcore_example("tutorials/feature_examples/pytorch/popdist/popdist_training.py")
    if src is None:
        pytest.skip("graphcore/examples is not available (set GRAPHCORE_EXAMPLES to a checkout)")
    (tmp_path / "popdist_training.py").write_text(src)
    stand_in = str(HERE / "torchvision_stand_in")
    r = _poprun(["--num-instances", "2", "--num-replicas", "2", sys.executable, "popdist_training.py", "--epochs", "1",
                 "--batch-size", "4", "--dataloader-workers", "0"], tmp_path, timeout=1800,
                PYTHONPATH=stand_in + os.pathsep + SRC, HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("Validation accuracy") == 2 and "Loss:" in r.stderr
    ck = [torch.load(tmp_path / f"checkpoint-instance-{i}.pt") for i in range(2)]
    keys = [k for k in ck[0] if k.endswith(("weight", "bias"))]
    assert len(keys) > 40
    for k in keys:
        assert torch.equal(ck[0][k], ck[1][k]), k
