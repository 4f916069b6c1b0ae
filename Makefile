# Two commands set everything up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
# OpenMPI refuses to run as root without these; harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
NP ?= 2

.PHONY: install install-gpu run test bench doctor clean

install:
	bash scripts/install.sh

install-gpu:
	GPU=1 bash scripts/install.sh

# MNIST (embedded 5000 digits) on $(NP) ranks, one TF thread each.
run: install
	horovodrun -np $(NP) ringtrain --model mnist_cnn --epochs 5 --threads 1

test: install
	python -m pytest tests

bench: install
	ringtrain-bench report --out bench/results

doctor: install
	ringtrain doctor

clean:
	rm -rf $(VENV) build *.egg-info
