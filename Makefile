# va-bench — every target installs what it needs into .venv first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Offline assets live beside the checkout; override on the command line or in the environment.
SHARED ?= ../shared
export VA_BENCH_COCO ?= $(SHARED)/assets/coco
export VA_BENCH_YOLOX_NANO ?= $(SHARED)/assets/onnx/yolox_nano.onnx
export VA_BENCH_CORPUS ?= $(SHARED)/corpus/vision-analysis

# glibc malloc's default thresholds caused millions of page faults (~25% CPU in the kernel) in
# detector forwards on the reference box; these keep freed arenas mapped. Recorded in every submission.
export GLIBC_TUNABLES ?= glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184

.PHONY: setup bench bench-overhead bench-hooks bench-run bench-memory test report-check lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch/torchvision pinned: the pair that installs from local wheels on the reference box
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[energy,memory,dev,fleet,libreyolo]'
	# libreyolo without its own requirements: they would add opencv-python beside opencv-python-headless
	$(BIN)/pip install --quiet --no-deps libreyolo==1.6.0
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/va-bench run --config configs/default.yaml

# DEVICE=cuda: images decoded inside the timed path, torch preprocessing on the GPU (see harness/bench/overhead.py)
DEVICE ?= cpu
BATCH ?= 8
bench-overhead: $(STAMP)
	$(BIN)/python -m harness.bench.overhead --batch-size $(BATCH) --device $(DEVICE)

bench-hooks: $(STAMP)
	$(BIN)/python -m harness.bench.hook_leak --backend pytorch --batch-size 8

# the whole run vs a plain batch-1 loop written independently of the harness (wall, CPU, peak RSS, mAP)
bench-run: $(STAMP)
	$(BIN)/python -m harness.bench.run_vs_loop --repeats 3

# peak RSS of a 5000-image run / a 500-image run on a synthetic tree (the sample re-keyed, in a temp folder)
bench-memory: $(STAMP)
	$(BIN)/python -m harness.bench.memory_scaling --small 500 --large 5000

test: $(STAMP)
	$(BIN)/python -m pytest -q

# `va-bench report`'s HTML rendered in headless Chromium (installs Debian's chromium; needs root)
report-check: $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python -m pytest -q tests/test_report.py -k chromium

lint: $(STAMP)
	$(BIN)/ruff check harness tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
