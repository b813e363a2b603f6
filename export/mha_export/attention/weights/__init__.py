"""Where the weights come from: the seed, or a checkpoint in any known layout."""
