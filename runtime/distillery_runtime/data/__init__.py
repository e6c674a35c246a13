"""What the loop feeds on: data sources read into rows, rows rendered into prompts (chat templates included),
the records one step passes along (`samples.py`), locations turned into local paths, the student's end
tokens, and the grouping of items into batches and shares (`packing.py`). Pure or I/O at the edge; uses
only `tasks/`."""
