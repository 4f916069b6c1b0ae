# Two commands set everything up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
# OpenMPI refuses to run as root without these; harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
NP ?= 2

.PHONY: install install-gpu wheel run test test-quick test-cpu docs bench bench-cluster bench-sync doctor clean

install:
	bash scripts/install.sh

install-gpu:
	GPU=1 bash scripts/install.sh

# The Horovod wheel `make install` builds (or its cached copy), and where it is: for `pip install`
# into another environment with the same TensorFlow and Python (docs/keras.md). GPU=1 for CUDA/NCCL.
wheel:
	bash scripts/install.sh --wheel-only

# MNIST (embedded 5000 digits) on $(NP) ranks, one TF thread each.
run: install
	horovodrun -np $(NP) ringtrain --model mnist_cnn --epochs 5 --threads 1

# (TEST_TOOLS: also Debian's headless Chromium, which renders the bench's HTML report in a test)
# Two test files at a time (pytest-xdist; a file's tests share its runs), the longest files
# first (tests/conftest.py), then the few that measure time or CPU, by themselves.
test:
	TEST_TOOLS=1 bash scripts/install.sh
	python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not alone" tests
	python -m pytest -m alone tests

# The fast subset (no launcher, no training, no cluster): under a minute, for quick edits.
test-quick: install
	python -m pytest -m "not slow" tests

# `make test` under the kernel's process accounting (root, nothing else running): each test
# file's CPU, and how much of it is processes that loaded TensorFlow (DEVELOPERS.md 4.13).
test-cpu: install
	python scripts/suite_cpu.py record build/suite-cpu -- $(MAKE) test

bench: install
	ringtrain-bench report --out bench/results

# Horovod's ring, TF's ring and PS across 4 simulated hosts (needs root): the allreduce
# algorithms on 1 Gbit/s links, then resnet50-sized gradients on a simulated accelerator at
# 1 Gbit/s and at 10 Gbit/s emulated by a time dilation of 10. Report: bench/results/cluster/scaling.md
CLUSTER_RUN := --cluster 4 --np 1,2,4 --model resnet50 --optimizer sgd --steps 4 --warmup-steps 1
bench-cluster: install
	ringtrain-bench allreduce --cluster 4 --link-rate 1gbit --np 2,4 --model resnet50 --sizes 64K..16M \
		--trials 2 --warmup-ops 1 --mpi-algorithms ring,rabenseifner,recursive_doubling,default --no-horovod --no-gloo \
		--out bench/results/cluster/allreduce
	ringtrain-bench scaling $(CLUSTER_RUN) --link-rate 1gbit --modes ring,ring-gloo,tf-collective,ps-sync,ps-async \
		--num-ps 1,N --out bench/results/cluster
	ringtrain-bench scaling $(CLUSTER_RUN) --link-rate 10gbit --time-dilation 10 --modes ring,tf-collective,ps-sync \
		--out bench/results/cluster

# Sync against async (Horovod's ring, TF's, sync PS, a backup worker, async PS): one straggler
# at 1x, 1.5x, 3x (simulated accelerator, 3 rounds), then time to 97% on the embedded MNIST
# (3 rounds). Reports: bench/results/sync/*.md
bench-sync: install
	ringtrain-bench straggler --np 2 --factors 1,1.5,3 --repeats 3 --out bench/results/sync
	ringtrain-bench convergence --np 2 --target 0.97 --repeats 3 --out bench/results/sync

# This documentation as a static site, offline, into site/
docs: install
	mkdocs build --strict

doctor: install
	ringtrain doctor

clean:
	rm -rf $(VENV) build *.egg-info
