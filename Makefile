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

.PHONY: setup build build-mpich demo test test-mpich test-mpich-ci lint bench clean

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

# graphscale linked against MPICH (run it with mpiexec.mpich or srun --mpi=pmi2).
build-mpich:
	@bash scripts/setup.sh mpich
	MPICC=mpicc.mpich CARGO_TARGET_DIR=target/mpich cargo build --release

# The unit tests and every mpirun suite again, built against MPICH (its own target directory)
# and launched by MPICH's mpiexec; MPICH_TESTS="--test mpi --test faults" picks suites (CI runs
# MPICH_CI's: the suites of the one-sided reads, the cache's exchange, faults and resume).
MPICH_CI := --test mpi --test faults --test remote --test strategy --test safety
test-mpich:
	@bash scripts/setup.sh mpich
	bash scripts/test-mpich.sh $(MPICH_TESTS)

test-mpich-ci:
	$(MAKE) test-mpich MPICH_TESTS="$(MPICH_CI)"

bench: build
	bash bench/run_benchmarks.sh

clean:
	cargo clean
