"""How a bundled synthetic task is made and kept: its character tokenizer, the SFT loop that trains its
teacher and student, the recipes' builds (`prepare`), and the cache folder each build lands in, once."""
