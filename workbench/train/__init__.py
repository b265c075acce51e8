"""Training recipe for the bundled models: tokenizer, target pre-training, DFlash drafter training."""
