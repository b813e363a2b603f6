"""`python -m mha_runtime ...` is the `mha` command."""
from mha_runtime.cli.main import main

main()
