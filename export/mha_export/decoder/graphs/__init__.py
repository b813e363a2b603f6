"""The GPT's decoder graphs, written node by node: the concat-cache and in-place forms and what they share."""
