"""The GPT's lossy forms (int8, int4): quantization plans and the search for one that meets its quality bar."""
