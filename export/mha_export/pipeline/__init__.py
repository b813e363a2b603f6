"""One artifact folder end to end: export, golden fixtures, validation, the manifest writer."""
