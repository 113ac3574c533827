"""Published end-to-end runs the cost model is checked against (see published.py)."""
