"""Real models through the main job: the nine light models shipped in ``onnx`` and all-MiniLM-L6-v2.

Light models: compared with their shipped expected outputs, and (with seeded random weights in
place of their ConstantOfShape weights) with onnxruntime on the same random input.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from openipu import runner

#: Models whose full-size graphs take more than ~20 s of host time: run in the slow set only.
HEAVY = {"light_vgg19", "light_densenet121", "light_zfnet512", "light_bvlc_alexnet"}

MODELS = [pytest.param(m, marks=pytest.mark.slow) if m in HEAVY else m for m in runner.LIGHT_MODELS]


def _expected(name):
    t = onnx.TensorProto()
    t.ParseFromString((runner.light_model_dir() / f"{name}_output_0.pb").read_bytes())
    return numpy_helper.to_array(t)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_shipped_output(name):
    res = runner.run_model(name)
    assert res.fits and res.step_cycles > 0
    (out,) = res.outputs.values()
    np.testing.assert_allclose(out.reshape(_expected(name).shape), _expected(name), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_random_weights_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    model = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model(name))), seed=0)
    feeds = runner.random_inputs(model, seed=0)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    res = runner.run_model(model, inputs=feeds)
    (out,) = res.outputs.values()
    scale = float(np.abs(ref).max())
    err = float(np.abs(out.reshape(ref.shape) - ref).max())
    print(f"{name}: max |openipu - onnxruntime| = {err:.3g} (output scale {scale:.3g})")
    assert err <= 1e-4 * scale
