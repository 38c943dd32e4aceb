# The README's two commands, spelled short.
.PHONY: run test sandbox
run:
	scripts/run.sh
sandbox:
	scripts/run.sh --sandbox
test:
	scripts/test.sh
