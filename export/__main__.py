"""`python -m mha_export ...` is the `mha` command."""
from mha_export.cli import main

main()
