"""The decoder's export steps in the one pipeline (mha_export.pipeline.run), a module per step, each a function of
the value the step before it returned: plan -> load -> build (the builder table, files.py) -> validate -> seal."""
