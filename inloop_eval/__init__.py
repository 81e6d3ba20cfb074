"""In-loop evaluation for language-model training."""
