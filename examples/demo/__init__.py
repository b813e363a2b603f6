"""`make demo`: a small book GPTModel trained offline on CPython's documentation topics, exported as gpt-demo."""
