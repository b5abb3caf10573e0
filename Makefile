# graphscale: `make demo` runs the main job, `make test` the tests. Both set up the machine first
# (system packages, idempotent) so that they work on a fresh Debian 12 as root.
SHELL := /bin/bash
export HDF5_DIR ?= /usr/lib/x86_64-linux-gnu/hdf5/serial
# Open MPI as root, oversubscribed on small machines; yield instead of busy-polling.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_mpi_yield_when_idle := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

RANKS ?= 4
DEMO_DIR ?= target/demo

.PHONY: setup build demo test lint bench clean

setup:
	@bash scripts/setup.sh

build: setup
	cargo build --release

demo: build
	RANKS=$(RANKS) DEMO_DIR=$(DEMO_DIR) bash scripts/demo.sh

lint: setup
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

test: lint
	cargo test --lib --bins --tests
	cargo bench --bench kernels --no-run

bench: build
	bash bench/run_benchmarks.sh

clean:
	cargo clean
