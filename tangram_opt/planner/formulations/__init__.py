"""The pipeline formulations."""
