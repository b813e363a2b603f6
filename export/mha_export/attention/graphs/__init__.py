"""One module per graph form, the shared graph helpers, and the table of builders keyed by the registry."""
