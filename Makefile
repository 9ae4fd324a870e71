# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed
SGL_VENV  := .venv-sglang
SGL_PY    := $(SGL_VENV)/bin/python
SGL_PIP   := $(SGL_PY) -m pip --disable-pip-version-check
SGL_STAMP := $(SGL_VENV)/.installed
SGL_DIR   := connectors/sglang

.PHONY: run test test-sglang bench replay redis proto clean

# torch is pinned to the CPU build served from local wheels; an unpinned torch pulls CUDA.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,torch]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gcache demo

test: $(STAMP) $(SGL_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider
	$(MAKE) --no-print-directory test-sglang

# The SGLang connector runs in SGLang's own environment: sglang==0.5.23 without its CUDA
# dependencies (connectors/sglang/requirements-cpu.txt), torch pinned to the CPU build. PyPI's
# torchvision is a CUDA build whose fake-kernel registrations fail next to CPU torch; SGLang
# imports it at start-up and text models never use it, so that one file is emptied. The
# test-only CPU shim (a sgl_kernel stand-in, a HiCache plugin) lives under the tests.

$(SGL_STAMP): pyproject.toml $(SGL_DIR)/pyproject.toml $(SGL_DIR)/requirements-cpu.txt \
              $(SGL_DIR)/constraints-cpu.txt $(SGL_DIR)/tests/cpu_shim/pyproject.toml
	python3 -m venv $(SGL_VENV)
	$(SGL_PIP) install -q torch==2.13.0
	$(SGL_PIP) install -q --no-deps sglang==0.5.23 torchvision==0.28.0
	$(SGL_PIP) install -q -c $(SGL_DIR)/constraints-cpu.txt -r $(SGL_DIR)/requirements-cpu.txt
	: > "$$($(SGL_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torchvision/_meta_registrations.py"
	$(SGL_PIP) install -q -c $(SGL_DIR)/constraints-cpu.txt -e . -e $(SGL_DIR)
	$(SGL_PIP) install -q --no-deps --no-build-isolation -e $(SGL_DIR)/tests/cpu_shim
	touch $(SGL_STAMP)

test-sglang: $(SGL_STAMP)
	$(SGL_PY) -m pytest -q -p no:cacheprovider $(SGL_DIR)/tests

# The Redis baseline of bench/dataplane.py needs Debian's redis-server.
redis:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)

bench: $(STAMP) redis
	$(PY) bench/dataplane.py
	$(PY) bench/tiers.py
	$(PY) bench/master.py
	$(PY) bench/update_readme.py

# Hit rate per SWA store policy on the conversation trace: in-process model and a real cluster.
replay: $(STAMP)
	$(VENV)/bin/gcache replay --cluster --out bench/results/replay-latest.json \
	  --plot bench/results/replay-latest.png
	$(PY) bench/update_readme.py

# Regenerate the master's gRPC code after editing gcache/proto/master.proto.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. gcache/proto/master.proto

clean:
	rm -rf $(VENV) $(SGL_VENV) build *.egg-info
