"""Chat on a decoder folder: its chat template rendered as transformers' apply_chat_template renders it
(template.py), and the folder's template, special tokens and end-of-turn ids (folder.py)."""
