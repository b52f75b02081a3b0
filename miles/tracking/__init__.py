"""Where a run's metrics go: ``metrics`` writes them (``metrics.jsonl``, TensorBoard, the progress bar) and
reduces them into the end-of-run summary; ``plot`` draws the PNG curves from a run folder (``miles-plot``)."""
