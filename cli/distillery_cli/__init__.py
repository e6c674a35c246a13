"""The umbrella `distillery` command (main.py): the layer above the API, the operator and the runtime."""
