"""PopTorch as its users write it (issue 36): the module paths PopTorch programs import
(``poptorch.poptorch_core``, ``_utils``, ``_impl``, ``enums`` ...), custom argument parsers and
compile hooks, optimizer ``variable_attrs``, phased execution, overlapped I/O, the options
PopTorch has, its exceptions and log lines, report folders and the hardware-only APIs on the
simulated IPU. Results are checked against PyTorch on the CPU."""

from __future__ import annotations

import io
import json
import logging
import os

import pytest
import torch

import poptorch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


# -- module paths ----------------------------------------------------------------------------
def test_poptorch_module_paths_import():
    import poptorch._impl
    import poptorch._poplar_executor
    import poptorch._utils
    import poptorch.enums
    import poptorch.poptorch_core
    from poptorch.poptorch_core import Error, RecoverableError, TestErrorType, UnrecoverableError  # noqa: F401
    assert poptorch.poptorch_core.Error is poptorch.Error
    assert issubclass(poptorch.RecoverableError, poptorch.Error)
    assert issubclass(poptorch.UnrecoverableError, poptorch.Error)
    assert poptorch._poplar_executor.PoplarExecutor is poptorch.PoplarExecutor
    assert poptorch.enums.OutputMode is poptorch.OutputMode
    assert poptorch.__version__.startswith("3.4.0")
    assert poptorch.ipuHardwareIsAvailable() and poptorch.ipuHardwareVersion() == 2


def test_is_running_on_ipu_and_dispatch_tracing_only_while_capturing():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((poptorch.isRunningOnIpu(), poptorch._impl.isDispatchTracing(),
                         poptorch.poptorch_core.isCompilingWithDispatcher()))
            return x * 2 if poptorch.isRunningOnIpu() else x * 3
    m = Probe()
    assert torch.equal(m(torch.ones(2)), torch.full((2,), 3.0))
    out = poptorch.inferenceModel(m)(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    assert seen == [(False, False, False), (True, True, True)]
    assert not poptorch.isRunningOnIpu() and not poptorch._impl.isDispatchTracing()


@pytest.mark.parametrize("kind,cls,typ,msg", [
    ("Poptorch", poptorch.Error, "poptorch_cpp_error", "This is a PopTorch error"),
    ("Popart", poptorch.Error, "popart_exception", "This is a Popart error"),
    ("PopartInternal", poptorch.Error, "popart_internal_exception", "This is a Popart error"),
    ("Poplibs", poptorch.Error, "poplibs_exception", "This is a Poplibs error"),
    ("PoplarUnrecoverable", poptorch.UnrecoverableError, "poplar_unrecoverable_runtime_error",
     "This is not recoverable"),
    ("PoplarUnknown", poptorch.Error, "poplar_unknown_runtime_error", "Don't know what happened"),
    ("PoplarRecoverableFullReset", poptorch.RecoverableError, "poplar_recoverable_runtime_error", "Reboot needed"),
    ("PoplarLinkError", poptorch.Error, "poplar_link_error", "Link error"),
])
def test_test_errors(kind, cls, typ, msg):
    from poptorch.poptorch_core import TestErrorType, _throwTestError
    with pytest.raises(cls, match=msg) as info:
        _throwTestError(getattr(TestErrorType, kind))
    e = info.value
    assert type(e) is cls and e.type == typ and e.message.startswith(msg)
    assert str(e).startswith(f"'{typ}': {msg}") and "throwTestError::topLevel" in e.location
    if cls is poptorch.RecoverableError:
        assert e.recovery_action == "FULL_RESET" and "Recovery action required: FULL_RESET" in str(e)


def test_create_poptorch_error():
    e = poptorch._impl.createPoptorchError("boom")
    assert isinstance(e, poptorch.poptorch_core.Error)
    assert (e.type, e.message, e.location, str(e)) == ("poptorch_py_error", "boom", "", "'poptorch_py_error': boom")


# -- custom arg parsers, hooks -----------------------------------------------------------
class Pair:
    def __init__(self, a, b, scale):
        self.a, self.b, self.scale = a, b, scale


class PairParser(poptorch.ICustomArgParser):
    def __init__(self):
        self.calls = 0

    def yieldTensors(self, struct):  # noqa: N802
        self.calls += 1
        yield struct.a
        yield struct.b

    def reconstruct(self, original_structure, tensor_iterator):
        return Pair(next(tensor_iterator), next(tensor_iterator), original_structure.scale)


class UsesPair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, p):
        return self.fc(p.a) * p.scale + p.b


def test_custom_arg_parser_flattens_inputs():
    torch.manual_seed(0)
    parser = PairParser()
    poptorch.registerCustomArgParser(Pair, parser)
    try:
        m = UsesPair()
        pm = poptorch.inferenceModel(m, poptorch.Options().deviceIterations(2))
        p = Pair(torch.randn(4, 4), torch.randn(4, 4), 3.0)
        out = pm(p)
        torch.testing.assert_close(out, m(p).detach(), rtol=1e-5, atol=1e-5)
        assert parser.calls > 0
        p2 = Pair(torch.randn(4, 4), torch.randn(4, 4), 3.0)
        torch.testing.assert_close(pm(p2), m(p2).detach(), rtol=1e-5, atol=1e-5)
        with pytest.raises(poptorch.Error, match="arg_parser must inherit from ICustomArgParser"):
            poptorch.registerCustomArgParser(Pair, object())
    finally:
        poptorch.registerCustomArgParser(Pair, None)
    assert Pair not in poptorch._utils.custom_arg_parsers
    flat = poptorch._utils.flattenTensorStructure({"x": [torch.ones(1), 3, (torch.zeros(2),)]})
    assert [t.shape for t in flat] == [torch.Size([1]), torch.Size([2])]


def test_pre_and_post_compile_hooks_are_called():
    calls = []
    pre = poptorch.registerPreCompileHook(lambda: calls.append(("pre", poptorch.isRunningOnIpu())))
    post = poptorch.registerPostCompileHook(lambda: calls.append(("post", poptorch.isRunningOnIpu())))
    try:
        pm = poptorch.inferenceModel(Net())
        pm(torch.ones(2, 4))
        pm(torch.ones(2, 4))             # compiled once: hooks called once
        assert calls == [("pre", False), ("post", False)]
    finally:
        pre.remove()
        post.remove()
    poptorch.inferenceModel(Net())(torch.ones(2, 4))
    assert len(calls) == 2
    with pytest.raises(RuntimeError, match="Pre-compile hook must be callable"):
        poptorch.registerPreCompileHook(3)


def test_input_requiring_grad_is_detached_with_poptorch_warning(caplog):
    caplog.set_level(logging.WARNING, logger="poptorch::python")
    m = Net()
    x = torch.ones(2, 4, requires_grad=True)
    torch.testing.assert_close(poptorch.inferenceModel(m)(x), m(x).detach())
    assert "Input tensor has requires_grad=True set. This tensor will be detached" in caplog.text


# -- optimizer attributes --------------------------------------------------------------------
def test_optimizer_variable_attrs():
    m = Net()
    opt = poptorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    va = opt.variable_attrs
    assert not va.isConstant("lr") and not va.isConstant("momentum") and va.isConstant("weight_decay")
    assert "loss_scaling" in va._allowed_attributes and "momentum" in va._allowed_attributes
    va.markAsVariable("weight_decay")
    va.markAsConstant("momentum")
    assert not va.isConstant("weight_decay") and va.isConstant("momentum")
    with pytest.raises(AssertionError, match="Unknown attribute foo"):
        va.markAsConstant("foo")
    adam = poptorch.optim.Adam(m.parameters(), lr=1e-3, loss_scaling=4.0)
    assert not adam.variable_attrs.isConstant("loss_scaling") and adam.variable_attrs.isConstant("eps")


def test_constant_optimizer_attribute_cannot_change():
    torch.manual_seed(0)

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            return poptorch.identity_loss(self.fc(x) ** 2, "mean")
    m = L()
    opt = poptorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5)
    opt.variable_attrs.markAsConstant("momentum")
    pm = poptorch.trainingModel(m, optimizer=opt)
    pm(torch.ones(2, 4))
    for g in opt.param_groups:
        g["lr"] = 0.05                  # variable: fine
    pm.setOptimizer(opt)
    for g in opt.param_groups:
        g["momentum"] = 0.9
    with pytest.raises(poptorch.Error):
        pm.setOptimizer(opt)


# -- execution strategies, overlapped I/O, MultiConv -------------------------------------
class TwoBlocks(torch.nn.Module):
    def __init__(self, overlap=False):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.overlap = overlap

    def forward(self, x):
        if self.overlap:
            x = poptorch.set_overlap_for_input(x, poptorch.OverlapMode.OverlapAccumulationLoop)
        with poptorch.Block("A"):
            x = torch.relu(self.a(x))
        with poptorch.Block("B"):
            x = self.b(x)
        if self.overlap:
            x = poptorch.set_overlap_for_output(x, poptorch.OverlapMode.OverlapDeviceIterationLoop)
        return x


@pytest.mark.parametrize("strategy", ["serial", "parallel"])
def test_phased_execution_matches_cpu(strategy):
    torch.manual_seed(0)
    m = TwoBlocks()
    if strategy == "serial":
        st = poptorch.SerialPhasedExecution(poptorch.Phase("A"), poptorch.Phase("B"))
        st.phase(0).ipus(0)
        st.phase(1).ipus(1)
        st.setTensorsLiveness(poptorch.Liveness.OffChipAfterEachPhase)
        assert st.backendOptions()["serial_phases_execution"] is True
    else:
        st = poptorch.ParallelPhasedExecution([poptorch.Stage("A")], [poptorch.Stage("B")])
        st.sendTensorsOffChipAfterFwd()
        assert st.backendOptions() == {"execution_mode": 2, "separate_backward_phase": False,
                                       "tensors_liveness": int(poptorch.Liveness.OffChipAfterFwd),
                                       "serial_phases_execution": False}
    x = torch.randn(2, 4)
    pm = poptorch.inferenceModel(m, poptorch.Options().setExecutionStrategy(st))
    torch.testing.assert_close(pm(x), m(x).detach(), rtol=1e-5, atol=1e-6)
    assert pm._built.num_ipus == 2 and not pm._built.pipelined
    with pytest.raises(AssertionError, match="Phase contains 1 stages but you provided 2 ipus"):
        poptorch.Phase("A").ipus(0, 1)


def test_overlapped_io_checks_and_results():
    torch.manual_seed(0)
    m = TwoBlocks(overlap=True)
    x = torch.randn(4, 4)
    with pytest.raises(poptorch.Error, match="Overlapped IO is not supported with poptorch.PipelinedExecution"):
        poptorch.inferenceModel(m)(x)
    def sharded():
        return poptorch.ShardedExecution(poptorch.Stage("A", "B").ipu(0))
    opts = poptorch.Options().setExecutionStrategy(sharded())
    with pytest.raises(poptorch.Error, match="No IO tiles allocated"):
        poptorch.inferenceModel(m, opts)(x)
    opts = poptorch.Options().setExecutionStrategy(sharded()).outputMode(poptorch.OutputMode.Final)
    opts.TensorLocations.numIOTiles(32)
    with pytest.raises(poptorch.Error, match="Unsupported output mode for overlapped IO"):
        poptorch.inferenceModel(m, opts)(x)
    opts = poptorch.Options().setExecutionStrategy(sharded()).deviceIterations(2)
    opts.TensorLocations.numIOTiles(32)
    torch.testing.assert_close(poptorch.inferenceModel(m, opts)(x), m(x).detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(poptorch.Error, match="You may only set overlap for torch.tensor inputs"):
        poptorch.set_overlap_for_input([torch.ones(1), 3], poptorch.OverlapMode.NoOverlap)


def test_nested_multiconv_raises_when_compiled():
    class Nested(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(1, 1, 1)

        def forward(self, x):
            with poptorch.MultiConv():
                with poptorch.MultiConv():
                    return self.c(x)
    m = Nested()
    m(torch.ones(1, 1, 2, 2))          # on the CPU nothing is checked
    with pytest.raises(poptorch.Error, match="Nested poptorch.MultiConv is not supported."):
        poptorch.inferenceModel(m)(torch.ones(1, 1, 2, 2))


# -- options -------------------------------------------------------------------------------
def test_output_mode_period_ignored_and_max_repeat_logs():
    o = poptorch.Options().outputMode(poptorch.OutputMode.All, 5)
    assert o.output_mode == poptorch.OutputMode.All and o.output_return_period == 1
    with pytest.raises(AssertionError, match="EveryN anchor must have output_return_period"):
        poptorch.Options().outputMode(poptorch.OutputMode.EveryN)
    assert poptorch.Options().maxRepeatLogs(None).max_repeat_logs == (1 << 64) - 1
    assert poptorch.Options().maxRepeatLogs(2).max_repeat_logs == 2


def test_training_mean_reduction_strategy_and_distributed():
    o = poptorch.Options()
    o.Training.setMeanAccumulationAndReplicationReductionStrategy(poptorch.MeanReductionStrategy.Running)
    assert o.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Running
    assert (o.Distributed.processId, o.Distributed.numProcesses) == (0, 1)
    o.Distributed.configureProcessId(1, 4)
    assert (o.Distributed.processId, o.Distributed.numProcesses) == (1, 4)
    os.environ["OPENIPU_TEST_N"], os.environ["OPENIPU_TEST_ID"] = "8", "3"
    try:
        o.Distributed.setEnvVarNames("OPENIPU_TEST_N", "OPENIPU_TEST_ID")
    finally:
        del os.environ["OPENIPU_TEST_N"], os.environ["OPENIPU_TEST_ID"]
    assert (o.Distributed.processId, o.Distributed.numProcesses) == (3, 8)
    o.Distributed.disable()
    assert o.clone().Distributed.numProcesses == 1
    # Precision options only hardware honours are accepted
    o.Precision.enableStochasticRounding(True).enableFloatingPointExceptions(True).setPartialsType(torch.half)
    so = o.session_options(False, 1, False)
    assert so.enableStochasticRounding and so.enableFloatingPointChecks and so.partialsTypeMatMuls == "half"


def test_load_from_file(tmp_path):
    p = tmp_path / "poptorch.conf"
    p.write_text("deviceIterations(1)\nsetExecutionStrategy(poptorch.ShardedExecution())\nreplicationFactor(1)\n"
                 "enableSyntheticData(True)\n# a comment\nTraining.gradientAccumulation(4)\n"
                 "_Popart.set(\"outlineThreshold\", 10.0)\nPrecision.setPartialsType(torch.half)\n")
    o = poptorch.Options().loadFromFile(str(p))
    assert isinstance(o._execution_strategy, poptorch.ShardedExecution) and o.synthetic_data
    assert o.Training.gradient_accumulation == 4 and o._Popart.options["outlineThreshold"] == 10.0
    p.write_text("deviceIterations(4)\n")
    assert o.loadFromFile(str(p)).device_iterations == 4 and o.Training.gradient_accumulation == 4
    p.write_text("deviceIterations(\n")
    with pytest.raises(poptorch.ConfigFileError, match="SyntaxError at line 1 of poptorch.conf"):
        poptorch.Options().loadFromFile(str(p))
    for bad in ("deviceIterations(__import__('os').getpid())", "__class__.__init__(1)",
                "deviceIterations(torch.load('x'))", "logDir(poptorch.load('x'))"):
        p.write_text(bad + "\n")
        with pytest.raises(poptorch.ConfigFileError):
            poptorch.Options().loadFromFile(str(p))


# -- logging, errors, reports, progress bar -----------------------------------------------
def test_log_format_and_levels(capsys):
    poptorch.setLogLevel("INFO")
    try:
        buf = io.StringIO()
        h = poptorch._logging.logger.handlers[0]
        old = h.setStream(buf)
        try:
            poptorch.Options().outputMode(poptorch.OutputMode.Final, 3)
        finally:
            h.setStream(old)
        line = buf.getvalue().strip()
        assert "] [poptorch::python] [info] Anchor return period argument ignored with output_mode set to" in line
        assert line.startswith("[") and line[9] == "."          # [HH:MM:SS.mmm]
        poptorch.setLogLevel(3)
        assert poptorch.logger.level == logging.WARNING
        with pytest.raises(ValueError, match="Unknown log level: LOUD. Valid values are DEBUG, ERR, INFO, OFF, "
                                             "TRACE and WARN"):
            poptorch.setLogLevel("LOUD")
    finally:
        poptorch.setLogLevel("WARN")


def test_report_folders(tmp_path):
    torch.manual_seed(0)
    opts = poptorch.Options()
    opts._Popart.setEngineOptions({"autoReport.all": "true", "autoReport.directory": str(tmp_path)})

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            y = self.fc(x)
            return y, poptorch.identity_loss(y ** 2, "mean")
    m = L()
    poptorch.trainingModel(m, opts)(torch.ones(2, 4))
    poptorch.inferenceModel(m, opts)(torch.ones(2, 4))
    assert (tmp_path / "training" / "profile.pop").is_file()
    assert (tmp_path / "inference" / "profile.pop").is_file()
    named = poptorch.Options().modelName("mine")
    named._Popart.setEngineOptions({"autoReport.all": "true", "autoReport.directory": str(tmp_path)})
    poptorch.inferenceModel(Net(), named)(torch.ones(2, 4))
    assert (tmp_path / "mine" / "profile.pop").is_file()


def test_progress_bar_format():
    from openipu.poptorch.executor import _PopTorchBar
    import tqdm
    buf = io.StringIO()
    bar = _PopTorchBar(7)
    bar._bar.fp = buf
    for _ in range(7):
        bar.update(1)
    bar.close()
    assert bar._shown == 100 and isinstance(bar._bar, tqdm.tqdm)
    assert bar._bar.desc == "Graph compilation"
    assert poptorch.Options().show_compilation_progress_bar is True


def test_debug_get_popart_ir():
    pm = poptorch.inferenceModel(Net())
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
        pm._debugGetPopartIR()
    pm(torch.ones(2, 4))
    ir = json.loads(pm._debugGetPopartIR())
    types = [op["type"] for op in ir["maingraph"]]
    assert "MatMul" in types or "Gemm" in types
    assert any(t["name"] == "fc.weight" for op in ir["maingraph"] for t in op["inputs"])
    assert json.loads(poptorch.poptorch_core._getPopartIR(pm)) == ir


# -- hardware-only APIs on the simulated IPU ------------------------------------------------
def test_perf_counters_are_predicted():
    pm = poptorch.inferenceModel(Net(), poptorch.Options().deviceIterations(4))
    pm(torch.ones(8, 4))
    pc = pm.getPerfCounters()
    assert [len(pc[k]) for k in ("input", "input_complete", "output", "output_complete")] == [1, 1, 1, 1]
    assert len(pc["input"][0]) == 4 and len(pc["output"][0]) == 4
    for k in range(4):
        assert pc["input"][0][k] < pc["input_complete"][0][k] <= pc["output"][0][k] < pc["output_complete"][0][k]
    # the steps are spaced by the predicted cycles of an iteration at the tile clock
    clock = pm._session.deviceInfo.device.getTarget().getTileClockFrequency()
    step = pm._session.getCycleCount() / clock / 4
    # (the stamps are host clock seconds: their difference is exact only to their float spacing,
    # which grows with the clock's value, e.g. 3.6e-12 s after 9 hours)
    import math
    assert pc["input"][0][1] - pc["input"][0][0] == pytest.approx(step, rel=1e-6, abs=4 * math.ulp(pc["input"][0][1]))
    for lat in (pm.getHostIpuLatency(), pm.getComputeLatency(), pm.getIpuHostLatency(), pm.getLatency()):
        assert 0 <= lat[0] <= lat[2] <= lat[1] < 1.0


def test_attach_detach_and_on_demand_connection():
    m = Net()
    x = torch.ones(2, 4)
    pm = poptorch.inferenceModel(m, poptorch.Options().connectionType(poptorch.ConnectionType.OnDemand))
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
        pm.attachToDevice()
    pm.compile(x)
    assert pm.isCompiled() and not pm.isAttachedToDevice()      # OnDemand: attached at the first run
    torch.testing.assert_close(pm(x), m(x).detach())
    assert pm.isAttachedToDevice()
    with pytest.raises(poptorch.Error, match="Device is already attached"):
        pm.attachToDevice()
    pm.detachFromDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        pm.detachFromDevice()
    with torch.no_grad():
        m.fc.bias.add_(1.0)
    pm.attachToDevice()                      # weights sent again
    torch.testing.assert_close(pm(x), m(x).detach())
    offline = poptorch.inferenceModel(Net(), poptorch.Options().useOfflineIpuTarget())
    with pytest.raises(AssertionError, match="Trying to run a model on an offline device"):
        offline(x)


def test_hardware_random_seed_state():
    class Noise(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape)
    pm = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(5))
    a = pm(torch.ones(64))
    assert pm.rng_state[0] == 5
    pm.rng_state = [5, 11, 12]                 # seed and the per-tile hardware state
    assert pm.rng_state == [5, 11, 12]
    b = pm(torch.ones(64))
    c = pm(torch.ones(64))
    assert ((a >= 1) & (a < 2)).all() and torch.equal(a, b)       # the seed set again: the same draws
    assert not torch.equal(b, c)


def test_profiling_channel():
    import poptorch.profiling
    ch = poptorch.profiling.Channel("MyApp")
    with ch.tracepoint("TimeThis"):
        pass

    class O:
        def f(self):
            return 3
    assert ch.instrument(O(), "f").f() == 3


def test_dataloader_splits_the_dataset_between_distributed_processes():
    data = torch.utils.data.TensorDataset(torch.arange(20.0))
    seen = []
    for pid in range(2):
        o = poptorch.Options().deviceIterations(2)
        o.Distributed.configureProcessId(pid, 2)
        loader = poptorch.DataLoader(o, data, batch_size=2)
        assert len(loader) == 2 and loader.combinedBatchSize == 4
        seen.append(torch.cat([b[0] for b in loader]).tolist())
    assert seen == [list(map(float, range(8))), list(map(float, range(8, 16)))]
    o = poptorch.Options()
    o.Distributed.configureProcessId(0, 2)
    with pytest.raises(AssertionError, match="you must set poptorch.Options.randomSeed"):
        poptorch.DataLoader(o, data, batch_size=2, shuffle=True)
    shuffled = []
    for pid in range(2):
        o = poptorch.Options().randomSeed(7)
        o.Distributed.configureProcessId(pid, 2)
        shuffled += torch.cat([b[0] for b in poptorch.DataLoader(o, data, batch_size=5, shuffle=True)]).tolist()
    assert sorted(shuffled) == list(map(float, range(20))) and shuffled != list(map(float, range(20)))


def test_options_setters_take_poptorch_keyword_names():
    # PopTorch Geometric's tests and user code pass these by keyword
    o = poptorch.Options().deviceIterations(device_iterations=3).replicationFactor(replication_factor=2)
    o.Training.gradientAccumulation(gradient_accumulation=4)
    o.randomSeed(random_seed=7)
    assert (o.device_iterations, o.replication_factor, o.Training.gradient_accumulation, o.random_seed) == (3, 2, 4, 7)


# -- messages as PopTorch words them ---------------------------------------------------------
def test_option_and_compile_messages(caplog):
    caplog.set_level(logging.WARNING, logger="poptorch::python")
    o = poptorch.Options()
    o.Jit.traceModel(False)
    assert "[Deprecated] Do not call options.Jit.traceModel()" in caplog.text
    with pytest.raises(ValueError, match=r"^options\.Jit\.traceModel\(True\) is no longer supported$"):
        o.Jit.traceModel(True)
    with pytest.raises(AssertionError, match=r"where the 0 in IPU is the index of the IPU\. Invalid key: GPU0"):
        o.setAvailableMemoryProportion({"GPU0": 0.5})
    o.setAvailableMemoryProportion({"IPU0": 0.3})
    pm = poptorch.inferenceModel(Net(), o)
    pm.compile(torch.ones(2, 4))
    caplog.clear()
    pm.compile(torch.ones(2, 4))
    assert "Call to compile() ignored: the executable is already compiled" in caplog.text
    with pytest.raises(poptorch.Error, match="don't match the inputs used to compile the model"):
        pm(torch.ones(3, 4))
