"""The whole GPT (the book's GPTModel, Hugging Face GPT-2): config, contract, manifest and generation, torch-free."""
