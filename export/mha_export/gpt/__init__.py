"""The whole GPT: the book's GPTModel (or Hugging Face GPT-2) exported as decoders with a key/value cache."""
