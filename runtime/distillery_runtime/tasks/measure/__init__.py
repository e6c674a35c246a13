"""How a model is measured on a bundled task: greedy held-out accuracy (`evaluate`), and for a tool-using
task its multi-turn episodes played with the environment's answers spliced in (`episodes`)."""
