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

.PHONY: gpu-pack test-slow setup bench bench-overhead bench-convoy bench-hooks bench-run bench-runtimes bench-sweep bench-memory bench-masks test report-check lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch/torchvision pinned: the pair that installs from local wheels on the reference box
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[energy,memory,dev,fleet,libreyolo,edge]'
	# libreyolo without its own requirements: they would add opencv-python beside opencv-python-headless
	$(BIN)/pip install --quiet --no-deps libreyolo==1.6.0
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/va-bench run --config default

# DEVICE=cuda: images decoded inside the timed path, torch preprocessing on the GPU (see harness/bench/overhead.py)
DEVICE ?= cpu
BATCH ?= 8
bench-overhead: $(STAMP)
	$(BIN)/python -m harness.bench.overhead --batch-size $(BATCH) --device $(DEVICE)

# an eager forward beside tensor calls on a thread and in a process (the interpreter-lock convoy, on the CPU)
bench-convoy: $(STAMP)
	$(BIN)/python -m harness.bench.lock_convoy --batch-size 8

bench-hooks: $(STAMP)
	$(BIN)/python -m harness.bench.hook_leak --backend pytorch --batch-size 8

# the whole run vs a plain batch-1 loop written independently of the harness (wall, CPU, peak RSS, mAP)
bench-run: $(STAMP)
	$(BIN)/python -m harness.bench.run_vs_loop --repeats 3

# a batch-size sweep's wall time against the timed passes inside it (target ratio <= 1.4)
bench-sweep: $(STAMP)
	$(BIN)/python -m harness.bench.sweep --repeats 3

# OpenVINO's forward against its own benchmark_app on the same IR, time-sliced; forward p50 and mAP per runtime x precision x batch
bench-runtimes: $(STAMP)
	$(BIN)/python -m harness.bench.runtimes --threads 2 --repeats 5 --limit 106

# peak RSS of a 5000-image run / a 500-image run on a synthetic tree (the sample re-keyed, in a temp folder)
bench-memory: $(STAMP)
	$(BIN)/python -m harness.bench.memory_scaling --small 500 --large 5000

bench-masks: $(STAMP)
	$(BIN)/python -m harness.bench.mask_memory --batch 8

# Two processes, a test file each at a time (its fixtures stay in one process). OpenMP's threads wait passively:
# spinning, each process's idle threads took the cores the other needed, and two were no faster than one.
# A process that dies is that test's failure, not restarted to die again. TEST_WORKERS=0 runs the suite in this
# process.
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 \
		-m "not catalogue and not heavy"

# matrices that grow with the catalogue (every variant of a family); run before a change to a family or runtime lands
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "catalogue or heavy"

# `va-bench report`'s HTML rendered in headless Chromium (installs Debian's chromium; needs root)
report-check: $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python -m pytest -q tests/test_report.py -k chromium

lint: $(STAMP)
	$(BIN)/ruff check harness tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The GPU acceptance's carry (docs/gpu-checklist.md): py3.12 x86-64 wheels the lent GPU machine lacks, at this
# venv's versions, and the assets a run needs, in .gpu-pack/ (ignored by git; <= 64 MiB with the checkout).
GPU_PACK := .gpu-pack
GPU_WHEELS := onnx2torch pycocotools faster-coco-eval pydantic pydantic-core annotated-types typing-inspection \
	typing-extensions jsonschema jsonschema-specifications referencing rpds-py simplejpeg typer click annotated-doc \
	shellingham libreyolo py-spy
PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64
gpu-pack: $(STAMP)
	rm -rf $(GPU_PACK) && mkdir -p $(GPU_PACK)/wheels $(GPU_PACK)/coco/annotations $(GPU_PACK)/onnx
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(PLATFORMS) \
		-d $(GPU_PACK)/wheels $$($(BIN)/pip freeze | grep -i -E "^($$(echo $(GPU_WHEELS) | sed 's/[-_]/[-_]/g; s/ /|/g'))==")
	cp -rL $(VA_BENCH_COCO)/val2017 $(GPU_PACK)/coco/
	cp $(VA_BENCH_COCO)/annotations/instances_val2017_subset.json $(GPU_PACK)/coco/annotations/
	cp $(VA_BENCH_YOLOX_NANO) $(GPU_PACK)/onnx/
	@echo "$(GPU_PACK): $$(du -sh $(GPU_PACK) | cut -f1) ($$(ls $(GPU_PACK)/wheels | wc -l) wheels); with the checkout:" \
		"$$(( ($$(du -sk $(GPU_PACK) | cut -f1) + $$(git ls-files -z | du -ck --files0-from=- | tail -1 | cut -f1)) / 1024 )) MiB of 64"
	@echo "on the GPU (device run, carry [\"$(GPU_PACK)\"]): bash tools/gpu_check"
