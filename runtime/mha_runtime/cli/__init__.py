"""The one `mha` command: the runtime's commands, and those the export package adds through entry points."""
