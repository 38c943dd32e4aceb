# The README's two commands, spelled short.
.PHONY: run test sandbox
run:
	scripts/run.sh
sandbox:
	scripts/run.sh --sandbox
test:
	scripts/test.sh
.PHONY: bench
bench:
	scripts/bootstrap.sh && .venv/bin/python -m bench $(BENCH_ARGS)
