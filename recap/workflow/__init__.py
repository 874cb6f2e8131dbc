"""The pipeline's workflow helpers: stage fingerprints over the resolved config and the code."""
