# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed

.PHONY: run test bench replay redis proto clean

# torch is pinned to the CPU build served from local wheels; an unpinned torch pulls CUDA.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,torch]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gcache demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

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
	rm -rf $(VENV) build *.egg-info
